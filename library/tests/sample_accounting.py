"""What each rank trained on, sample by sample, for tests that count samples across runs (``python -m project``
finds these by class path: tests/ is on its path). The digits, each training sample carrying its index in two
pixels."""

import os
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


# What tells one attempt of a run from the next: SLURM's requeues, torchrun's restarts, the sbatch script's restarts in
# an allocation, and the warm restarts of the processes (trainfleet/runs/restarts.py).
ATTEMPT_VARS = ("SLURM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "PROJECT_RESTART_COUNT")
ATTEMPT_VARS += ("PROJECT_WARM_GENERATION",)


class AttemptSamples(TrainedSamples):
    """``TrainedSamples`` for runs that fail and resume, on any number of ranks: each attempt writes its own files,
    ``attempt<counts>-rank<rank>.txt``, whose first line is the step it started from (its checkpoint's) and whose
    lines are ``<epoch> <step> <index> ...`` (the step after the batch): what ``kept_samples`` needs to drop the
    steps a failure lost."""

    def attempt_file(self, trainer: Trainer) -> Path:
        counts = "-".join(f"{int(os.environ.get(name) or 0):03d}" for name in ATTEMPT_VARS)
        return self.output_dir / f"attempt{counts}-rank{trainer.global_rank}.txt"

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.attempt_file(trainer), "w") as file:
            file.write(f"{trainer.global_step}\n")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        line = " ".join(map(str, [trainer.current_epoch, trainer.global_step, *indices(batch[0])]))
        with open(self.attempt_file(trainer), "a") as file:
            file.write(line + "\n")


def kept_samples(output_dir: Path) -> tuple[dict[int, list[int]], list[tuple[int, int]]]:
    """{epoch: every index trained on in it, by every rank} counting only the steps the run kept: an attempt's steps
    after the step the next attempt resumed from were lost with it (trained again). Also each attempt's (start step,
    ranks), in order."""
    attempts: dict[str, dict[int, list[str]]] = {}
    for path in sorted(output_dir.glob("attempt*-rank*.txt")):
        name, _, rank = path.stem.rpartition("-rank")
        attempts.setdefault(name, {})[int(rank)] = path.read_text().splitlines()
    ordered = [attempts[name] for name in sorted(attempts)]
    starts = [int(ranks[0][0]) for ranks in ordered]  # rank 0's: every rank resumed from the same checkpoint
    kept: dict[int, list[int]] = {}
    for number, ranks in enumerate(ordered):
        limit = starts[number + 1] if number + 1 < len(ordered) else float("inf")
        for lines in ranks.values():
            for line in lines[1:]:
                epoch, step, *batch = map(int, line.split())
                if step <= limit:
                    kept.setdefault(epoch, []).extend(batch)
    return kept, [(start, len(ranks)) for start, ranks in zip(starts, ordered, strict=True)]
