"""MNIST through torchvision (the optional ``mnist`` extra): 70,000 real 28x28 digits, downloaded once.

torchvision is imported inside the methods, so the package works without it.
"""

import torch
from torch import Tensor

from trainfleet.data.in_memory import InMemoryDataModule


class MNISTDataModule(InMemoryDataModule):
    """torchvision's MNIST, held in memory and split like every ``InMemoryDataModule``.

    The 60,000 training and 10,000 test images are pooled and split with ``split_seed``
    (``test_fraction``, ``val_fraction``), so the samplers and loaders are the base class's.

    Args:
        root: folder torchvision reads (and downloads into): ``ROOT/MNIST/raw/*-ubyte``.
        download: fetch the files when they are missing (once per node, in ``prepare_data``).
        **kwargs: the ``BaseDataModule`` arguments (batch_size, val_fraction, ...).
    """

    num_classes = 10
    input_shape = (1, 28, 28)

    def __init__(self, root: str = "data", download: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.root = root
        self.download = download

    def prepare_data(self) -> None:
        """Lightning calls this on one process per node, before ``setup``: the only place that downloads."""
        if self.download:
            for train in (True, False):
                _mnist(self.root, train, download=True)

    def load(self) -> tuple[Tensor, Tensor]:
        parts = [_mnist(self.root, train, download=False) for train in (True, False)]
        images = torch.cat([part.data for part in parts]).unsqueeze(1).float() / 255.0
        return images, torch.cat([part.targets for part in parts]).long()


def _mnist(root: str, train: bool, download: bool):
    try:
        from torchvision.datasets import MNIST
    except ImportError as error:
        raise ImportError("MNISTDataModule needs torchvision: pip install -e '.[mnist]'") from error
    return MNIST(root, train=train, download=download)
