"""What each rank trained on, sample by sample, for tests that count samples across runs (``python -m project``
finds these by class path: tests/ is on its path). The digits, each training sample carrying its index in two
pixels."""

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from project.data import DigitsDataModule

HIGH, LOW = 32, 64  # index = round(pixel0 * HIGH) * LOW + round(pixel1 * LOW): values in [0, 1], exact in float32


class IndexedDigits(DigitsDataModule):
    """The digits with each training sample's index (its position in the training split, what the sampler draws)
    written into its first two pixels (0 in almost every digit): the batch then says which samples it holds."""

    def setup(self, stage: str) -> None:
        super().setup(stage)
        images = self.splits["train"].tensors[0]
        index = torch.arange(len(images))
        images[:, 0, 0, 0] = torch.div(index, LOW, rounding_mode="floor").float() / HIGH
        images[:, 0, 0, 1] = (index % LOW).float() / LOW


def indices(images: torch.Tensor) -> list[int]:
    high = torch.round(images[:, 0, 0, 0] * HIGH).long()
    return (high * LOW + torch.round(images[:, 0, 0, 1] * LOW).long()).tolist()


class TrainedSamples(Callback):
    """Appends, after every training batch, ``<epoch> <index> <index> ...`` to ``<output_dir>/rank<global rank>.txt``:
    the samples that rank trained on in that batch."""

    def __init__(self, output_dir: str) -> None:
        self.output_dir = Path(output_dir)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        line = " ".join(map(str, [trainer.current_epoch, *indices(batch[0])]))
        with open(self.output_dir / f"rank{trainer.global_rank}.txt", "a") as file:
            file.write(line + "\n")


def read_trained(output_dir: Path) -> dict[int, dict[int, list[int]]]:
    """{epoch: {rank: the indices that rank trained on, in order}} from what ``TrainedSamples`` wrote."""
    trained: dict[int, dict[int, list[int]]] = {}
    for path in sorted(output_dir.glob("rank*.txt")):
        rank = int(path.stem.removeprefix("rank"))
        for line in path.read_text().splitlines():
            epoch, *batch = map(int, line.split())
            trained.setdefault(epoch, {}).setdefault(rank, []).extend(batch)
    return trained
