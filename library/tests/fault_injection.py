"""Test-only callbacks, used by class path (tests/ is on PYTHONPATH): a rank fails, is signalled or pauses at a chosen
step; a rank counts its collectives."""

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet.runs.folders import restart_count


class FailAt(Callback):
    """At the end of training step ``step`` (global step), rank ``rank`` raises, or sends itself SIGKILL, SIGTERM or
    SIGSTOP (it hangs without dying).

    ``rank: -1`` fails every rank. Running before ModelCheckpoint (Lightning orders checkpoint callbacks
    last), so a checkpoint due at ``step`` is never written. ``attempt``: only in that attempt of a run torchrun
    restarts (0: the first), else in every one.
    """

    def __init__(
        self,
        step: int,
        rank: int = -1,
        action: Literal["raise", "sigkill", "sigterm", "sigstop"] = "raise",
        attempt: int | None = None,
    ) -> None:
        self.step, self.rank, self.action, self.attempt = step, rank, action, attempt

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.global_step != self.step or self.rank not in (-1, trainer.global_rank):
            return
        if self.attempt is not None and restart_count() != self.attempt:
            return
        if self.action in ("sigkill", "sigterm", "sigstop"):
            os.kill(os.getpid(), getattr(signal, self.action.upper()))
            return
        raise RuntimeError(f"injected failure on rank {trainer.global_rank} at step {self.step}")


class PauseAt(Callback):
    """At the end of training step ``step`` (global step), rank ``rank`` creates ``<folder>/paused`` and waits, up to a
    minute, for ``<folder>/go``: a test signals the run from outside at a known step, then lets it go on."""

    def __init__(self, step: int, folder: str, rank: int = 0) -> None:
        self.step, self.folder, self.rank = step, Path(folder), rank

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.global_step != self.step or trainer.global_rank != self.rank:
            return
        (self.folder / "paused").touch()
        deadline = time.monotonic() + 60
        while not (self.folder / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.02)


class SlowSteps(Callback):
    """Sleeps SECONDS after every training step (the numbers are unchanged): a job that runs long enough for a
    scheduler's signal to reach it mid-training. ``first_attempt_only``: not in a requeued SLURM job nor a restarted
    torchrun worker."""

    def __init__(self, seconds: float, first_attempt_only: bool = True) -> None:
        restarted = os.environ.get("SLURM_RESTART_COUNT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) != "0"
        self.seconds = 0.0 if first_attempt_only and restarted else seconds

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        time.sleep(self.seconds)


class SlowRank(Callback):
    """Rank ``rank`` sleeps SECONDS at the start of every training step, the other ranks OTHERS (before the preemption
    check's clock reads the step's start, so it counts as waiting for its batch): a throttled CPU or a slow disk on
    one rank, SECONDS / OTHERS times the others' step where they have one."""

    def __init__(self, seconds: float, rank: int = 1, others: float = 0.0) -> None:
        self.seconds, self.rank, self.others = seconds, rank, others

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if seconds := self.seconds if trainer.global_rank == self.rank else self.others:
            time.sleep(seconds)


COLLECTIVES = (
    "all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier", "monitored_barrier",
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
)  # fmt: skip


class CountCollectives(Callback):
    """Counts this rank's Python-level ``torch.distributed`` collectives during training steps.

    Each function is wrapped in ``torch.distributed`` once the process group exists (``setup``); the counts are
    read at the start of the first and of the last training step, and written to ``<output_dir>/rank<N>.json``.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.counts: Counter = Counter()
        self.first: tuple[int, dict[str, int]] | None = None
        self.last: tuple[int, dict[str, int]] | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for name in COLLECTIVES:
            setattr(dist, name, self._counted(name, getattr(dist, name)))

    def _counted(self, name: str, function: Callable) -> Callable:
        def counted(*args: object, **kwargs: object) -> object:
            self.counts[name] += 1
            return function(*args, **kwargs)

        return counted

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        self.last = (trainer.global_step, dict(self.counts))
        self.first = self.first or self.last

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        (first_step, before), (last_step, after) = self.first, self.last
        counts = {name: after.get(name, 0) - before.get(name, 0) for name in after}
        record = {"steps": last_step - first_step, "counts": {name: n for name, n in counts.items() if n}}
        path = Path(self.output_dir) / f"rank{trainer.global_rank}.json"
        path.write_text(json.dumps(record))
