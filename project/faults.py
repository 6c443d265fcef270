"""When a run goes wrong: name the failed rank, stop every process of the run, stop at the first NaN.

Distributed failures otherwise read as a peer's "Connection reset by peer", or as a hang: with NCCL a rank
blocked in a collective waits for the process-group timeout (``trainer.strategy.init_args.timeout``).
"""

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

DIST_HINT = (
    "every process must start with the same num_nodes and devices, reach MASTER_ADDR:MASTER_PORT, and join within"
    " trainer.strategy.init_args.timeout; `python -m project doctor` checks the setup"
)


class FailFast(Callback):
    """On an exception in any rank: say which rank failed and at which step, and stop the ranks it launched.

    Lightning's own launcher (``devices > 1`` without torchrun or SLURM) starts local ranks 1..n-1 from
    rank 0's process. It kills them only on Ctrl-C; a rank 0 that fails otherwise would leave them blocked
    in a collective. torchrun and srun stop the other ranks themselves (srun with ``--kill-on-bad-exit``).
    """

    def __init__(self) -> None:
        # Built in every rank's own process (Lightning's launcher reruns the command): the launcher, for ranks > 0.
        # Not in setup(): a failure to join the process group comes before it.
        self._parent_pid = os.getppid()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        where = f"rank {trainer.global_rank}/{trainer.world_size} failed at step {trainer.global_step}"
        report(f"{where}: {type(exception).__name__}: {first_line(exception)}")
        if isinstance(exception, torch.distributed.DistError):
            report(f"rank {trainer.global_rank}: {DIST_HINT}")
        launcher = trainer.strategy.launcher
        if isinstance(launcher, _SubprocessScriptLauncher) and launcher.procs:
            self._stop_launched_ranks(trainer, launcher)
        elif trainer.world_size > 1 and trainer.local_rank > 0 and self._launcher_is_gone():
            first_rank = trainer.node_rank * trainer.num_devices
            report(f"rank {first_rank}, the process that launched rank {trainer.global_rank}, is gone")

    def _stop_launched_ranks(self, trainer: Trainer, launcher: _SubprocessScriptLauncher) -> None:
        """Names the launched ranks that already ended badly, then kills the rest."""
        wait_until(lambda: any(proc.poll() for proc in launcher.procs))
        for local_rank, proc in enumerate(launcher.procs, start=1):
            rank = trainer.node_rank * launcher.num_processes + local_rank
            if proc.returncode is not None and proc.returncode < 0:
                report(f"rank {rank} (pid {proc.pid}) was killed by {signal.Signals(-proc.returncode).name}")
            elif proc.returncode:
                report(f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode}")
        launcher.kill(signal.SIGKILL)

    def _launcher_is_gone(self) -> bool:
        return wait_until(lambda: os.getppid() != self._parent_pid)


class NonFiniteGuard(Callback):
    """Stops training when the loss turns NaN/inf, naming the step, and never saves non-finite weights.

    The first bad step is recorded on the loss's device and read every ``log_every_n_steps`` steps, at epoch
    end and before each checkpoint: no host sync per step. It runs before ``ModelCheckpoint`` (Lightning
    orders checkpoint callbacks last), so the last checkpoint keeps the last finite weights.
    """

    _first_bad_step: torch.Tensor | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._first_bad_step = torch.tensor(-1, device=pl_module.device)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            newly_bad = (self._first_bad_step < 0) & ~torch.isfinite(loss.detach()).all()
            self._first_bad_step = torch.where(newly_bad, trainer.global_step, self._first_bad_step)
        if trainer.global_step % trainer.log_every_n_steps == 0:
            self._raise_if_bad(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raise_if_bad(trainer)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._raise_if_bad(trainer)
        state = checkpoint["state_dict"]
        bad = [name for name, value in state.items() if value.is_floating_point() and not value.isfinite().all()]
        if bad:
            raise FloatingPointError(
                f"non-finite weights at step {trainer.global_step} ({', '.join(bad[:3])}): not saving a checkpoint"
            )

    def _raise_if_bad(self, trainer: Trainer) -> None:
        step = -1 if self._first_bad_step is None else int(self._first_bad_step)
        if step >= 0:
            raise FloatingPointError(
                f"the training loss became NaN or inf at step {step} (seen at step {trainer.global_step});"
                " training stopped and no checkpoint holds the damage: lower the learning rate, or check the data"
            )


def report(message: str) -> None:
    print(f"[project] {message}", file=sys.stderr, flush=True)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Polls CONDITION for up to TIMEOUT seconds: a dead peer's exit status lags its closed sockets a little."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
