"""``PeriodicCheckpoint`` (the ``periodic`` config key): ``last.ckpt`` every so much training time, so that a crash, a
lost node or a killed job loses at most that much work, whatever the epochs' length. On by default under the cluster
launchers (``scripts/``, ``CHECKPOINT_EVERY``); off otherwise.

Written by hand because Lightning's ``ModelCheckpoint(train_time_interval=...)`` takes one trigger per callback (it
would replace the per-epoch checkpoints, and every other callback writing ``last.ckpt`` would clash with its name) and
broadcasts rank 0's clock at every training step (a collective, and on GPUs a host-device sync, per step). Here, with
several processes, rank 0's clock is told in the exchange the preemption check makes anyway (``PreemptionCheck``,
every ``preemption.check_every_n_steps`` steps, over a CPU group): no collective of its own.
"""

import time
from datetime import timedelta

from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet.checkpoints.last import save_last_checkpoint
from trainfleet.runtime.preemption import PreemptionCheck


class PeriodicCheckpoint(Callback):
    """Saves ``last.ckpt`` (exact: RNG states and the loader's position at that step, as every checkpoint) once
    ``every`` has passed since the last one, on rank 0's clock: with several processes at the preemption check's
    exchanges (``preemption.check_every_n_steps``), in one process every ``check_every_n_steps`` training steps.

    Args:
        every: training time between two checkpoints (``H:MM:SS``, e.g. ``0:30:00``); None: no periodic checkpoint.
        check_every_n_steps: how often one process reads its clock (several processes without a preemption check:
            how often they agree on rank 0's, one tiny broadcast): the checkpoint comes at most this many steps late.
    """

    def __init__(self, every: timedelta | None = None, check_every_n_steps: int = 10) -> None:
        if check_every_n_steps < 1:
            raise ValueError(f"periodic.check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.every, self.check_every_n_steps = every, check_every_n_steps
        self._last_save = 0.0
        self._steps = 0
        self._told_by_check = False  # several processes: the preemption check's exchange carries rank 0's clock

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check = next((callback for callback in trainer.callbacks if isinstance(callback, PreemptionCheck)), None)
        self._told_by_check = stage == "fit" and self.every is not None and check is not None and trainer.world_size > 1
        if self._told_by_check:
            check.periodic = self

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last_save = time.monotonic()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        if self.every is None or self._told_by_check:
            return
        self._steps += 1
        if self._steps % self.check_every_n_steps:
            return
        due = self.due()
        if trainer.world_size > 1:
            due = trainer.strategy.broadcast(due)  # rank 0's clock: every rank saves at the same step
        if due:
            self.save(trainer)

    def due(self) -> bool:
        return time.monotonic() - self._last_save >= self.every.total_seconds()

    def save(self, trainer: Trainer) -> None:
        """On every rank at the same step."""
        save_last_checkpoint(trainer)
        self._last_save = time.monotonic()

    def on_save_checkpoint(self, *args: object) -> None:
        """Any checkpoint (per epoch, a preemption stop) restarts the interval: work is lost since the newest one."""
        self._last_save = time.monotonic()
