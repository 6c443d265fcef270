"""Data modules: an in-memory base that supplies its own distributed samplers, and the digits set.

The Trainer runs with ``use_distributed_sampler=False``, so these samplers are the ones used:
``DistributedSampler`` for training (shuffled, seeded, reshuffled each epoch by Lightning's
``set_epoch`` call) and ``ExactDistributedSampler`` for val/test/predict, so every sample is counted once.
"""

from collections.abc import Iterable

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, Sampler, TensorDataset

from project.loaders import TensorBatchLoader
from project.samplers import ExactDistributedSampler


class InMemoryDataModule(LightningDataModule):
    """A classification data set held as two tensors, split deterministically into train/val/test.

    Subclasses implement ``load`` (images as float ``N x C x H x W``, labels as ``int64``) and set
    ``num_classes``; everything distributed lives here.

    Args:
        batch_size: samples per rank per step (the global batch is ``batch_size * world_size``).
        val_fraction, test_fraction: shares of the data set held out, split with ``split_seed``.
        split_seed: seeds the train/val/test split, independently of the training seed.
        shuffle: shuffle training data (reshuffled every epoch, the same on every rank).
        seed: seeds the training shuffle; ``DistributedSampler`` mixes in the epoch.
        drop_last: drop the last incomplete training batch of each epoch.
        in_memory: slice batches from tensors (fast); ``False`` uses torch's DataLoader.
        num_workers: DataLoader workers (only with ``in_memory: false``).
    """

    num_classes: int
    input_shape: tuple[int, ...]

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        split_seed: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        in_memory: bool = True,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not (0 <= val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
            raise ValueError(
                f"need 0 <= val_fraction, 0 < test_fraction and a sum below 1; got {val_fraction} and {test_fraction}"
            )
        self.save_hyperparameters()
        self.splits: dict[str, TensorDataset] = {}

    def load(self) -> tuple[Tensor, Tensor]:
        """Returns (images, labels) for the whole data set."""
        raise NotImplementedError

    def setup(self, stage: str) -> None:
        if self.splits:
            return
        images, labels = self.load()
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.hparams.split_seed))
        num_test = round(self.hparams.test_fraction * len(labels))
        num_val = round(self.hparams.val_fraction * len(labels))
        test, val, train = order[:num_test], order[num_test : num_test + num_val], order[num_test + num_val :]
        parts = {"train": train, "val": val, "test": test}
        self.splits = {name: TensorDataset(images[idx], labels[idx]) for name, idx in parts.items()}

    def train_dataloader(self) -> Iterable:
        num_replicas, rank = self._ranks()
        sampler = DistributedSampler(
            self.splits["train"], num_replicas, rank, shuffle=self.hparams.shuffle, seed=self.hparams.seed
        )
        return self._loader(self.splits["train"], sampler, drop_last=self.hparams.drop_last)

    def val_dataloader(self) -> Iterable:
        return self._eval_loader("val")

    def test_dataloader(self) -> Iterable:
        return self._eval_loader("test")

    def predict_dataloader(self) -> Iterable:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> Iterable:
        num_replicas, rank = self._ranks()
        return self._loader(self.splits[split], ExactDistributedSampler(self.splits[split], num_replicas, rank))

    def _ranks(self) -> tuple[int, int]:
        """(world size, global rank) from the Trainer; (1, 0) when used on its own."""
        if self.trainer is None:
            return 1, 0
        return self.trainer.world_size, self.trainer.global_rank

    def _loader(self, dataset: TensorDataset, sampler: Sampler[int], drop_last: bool = False) -> Iterable:
        if self.hparams.in_memory:
            return TensorBatchLoader(dataset.tensors, sampler, self.hparams.batch_size, drop_last)
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=self.hparams.num_workers,
            persistent_workers=self.hparams.num_workers > 0,
        )


class DigitsDataModule(InMemoryDataModule):
    """scikit-learn's bundled 8x8 handwritten digits: 1,797 real images, no download."""

    num_classes = 10
    input_shape = (1, 8, 8)

    def load(self) -> tuple[Tensor, Tensor]:
        from sklearn.datasets import load_digits  # imported here: scikit-learn is slow to import

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        return images, torch.tensor(digits.target, dtype=torch.long)
