"""Test-only callbacks that make a rank fail at a chosen step (used by class path: tests/ is on PYTHONPATH)."""

import os
import signal
from typing import Literal

from lightning.pytorch import Callback, LightningModule, Trainer


class FailAt(Callback):
    """At the end of training step ``step`` (global step), rank ``rank`` raises or SIGKILLs itself.

    ``rank: -1`` fails every rank. Running before ModelCheckpoint (Lightning orders checkpoint callbacks
    last), so a checkpoint due at ``step`` is never written. ``first_attempt_only``: not after a torchrun restart.
    """

    def __init__(
        self, step: int, rank: int = -1, action: Literal["raise", "sigkill"] = "raise", first_attempt_only: bool = False
    ) -> None:
        self.step, self.rank, self.action, self.first_attempt_only = step, rank, action, first_attempt_only

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if trainer.global_step != self.step or self.rank not in (-1, trainer.global_rank):
            return
        if self.first_attempt_only and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        if self.action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure on rank {trainer.global_rank} at step {self.step}")
