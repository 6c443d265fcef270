"""Data sets held in memory as two tensors: the fast path (batches sliced out of tensors)."""

from torch import Tensor
from torch.utils.data import Dataset, TensorDataset

from trainfleet.data.base import BaseDataModule


class InMemoryDataModule(BaseDataModule):
    """A classification data set held as two tensors, split deterministically into train/val/test.

    Subclasses implement ``load`` (images as float ``N x C x H x W``, labels as ``int64``) and set
    ``num_classes`` and ``input_shape``; splitting, samplers, loaders and arguments are ``BaseDataModule``'s.
    """

    def load(self) -> tuple[Tensor, Tensor]:
        """Returns (images, labels) for the whole data set."""
        raise NotImplementedError

    def datasets(self) -> dict[str, Dataset]:
        return {"train": TensorDataset(*self.load())}
