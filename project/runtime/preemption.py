"""Preemption: on SIGTERM to any rank, every rank stops at the same step, ``last.ckpt`` is saved, the run exits 143.

SLURM (``scancel``, a time limit, preemption) and Kubernetes (eviction, a deleted pod) send SIGTERM, then
SIGKILL after a grace period. Lightning 2.6 handles SIGTERM with two private pieces that this file replaces (through
``lightning_internals.take_over_sigterm``):

- ``_TrainingEpochLoop._broadcast_sigterm_tensor``: a broadcast and an ``.item()`` at the start of every training
  step of a multi-process run (Lightning-AI/pytorch-lightning#21487): one collective per step, and on GPUs one
  host-device sync per step, which stalls the asynchronous pipeline. Here it does nothing.
- ``_SignalConnector._sigterm_notifier_fn``: the SIGTERM handler, which broadcasts from inside the handler, where it
  pairs with whatever collective the other ranks are in (SIGTERM to rank 0 alone hung a 2-process run for the whole
  process-group timeout); and a run stopped that way exits 0, as if it had finished. Here it only sets a flag.

Every ``every_n_steps`` training steps, at the same step on every rank, the ranks sum their flags over a CPU
(gloo) group: a host-side exchange, never a GPU sync. When any rank was signalled, every rank stops after that step,
rank 0 saves ``last.ckpt`` through ModelCheckpoint's path and the checkpoint IO (atomic, RNG states included), and
every process exits with ``PREEMPTED_EXIT_CODE``. Lightning's SLURM auto-requeue (SIGUSR1) is left as it is.
"""

import os
import signal
import subprocess
import time
from types import FrameType

import torch
import torch.distributed as dist
from lightning.pytorch import Trainer

from project.runtime import lightning_internals as internals
from project.runtime.faults import report

# 128 + SIGTERM, what shells, SLURM and Kubernetes report for a process that SIGTERM ended: schedulers and scripts
# read "terminated before the end" (requeue, or resume with --ckpt_path last), not success (0) nor a crash (1).
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# How long rank 0 waits for the ranks it launched to exit after a stop (they only tear down), before killing them.
LAUNCHED_RANKS_EXIT_S = 30.0


class Preempted(SystemExit):
    """Every rank stopped on SIGTERM after saving; ends the process with ``PREEMPTED_EXIT_CODE``."""

    def __init__(self) -> None:
        super().__init__(PREEMPTED_EXIT_CODE)


class PreemptionCheck:
    """The SIGTERM flag, its exchange every ``every_n_steps`` steps, and the stop. Driven by ``RunGuard``."""

    def __init__(self, every_n_steps: int = 50) -> None:
        if every_n_steps < 1:
            raise ValueError(f"preemption_check_every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.signalled = False
        self._steps = 0
        self._group: dist.ProcessGroup | None = None

    def install(self, trainer: Trainer) -> None:
        """Called in ``setup("fit")`` on every rank: after the process group, before Lightning registers handlers."""
        internals.take_over_sigterm(trainer, self._on_sigterm)
        self.signalled, self._steps = False, 0
        if trainer.world_size > 1:  # every rank creates the group, as new_group requires
            gloo = dist.get_backend() == dist.Backend.GLOO
            self._group = dist.group.WORLD if gloo else dist.new_group(backend=dist.Backend.GLOO)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signalled = True  # nothing else: no I/O, no collective inside a signal handler

    def after_step(self, trainer: Trainer) -> None:
        """After each training step: on a check step, stop every rank if any rank was signalled."""
        self._steps += 1
        if self._group is None:  # one process: nothing to agree on, so every step
            if self.signalled:
                self._stop(trainer, [trainer.global_rank])
        elif self._steps % self.every_n_steps == 0:
            flags = torch.zeros(trainer.world_size, dtype=torch.int32)
            flags[trainer.global_rank] = self.signalled
            dist.all_reduce(flags, group=self._group)
            if signalled_ranks := flags.nonzero().flatten().tolist():
                self._stop(trainer, signalled_ranks)

    def _stop(self, trainer: Trainer, signalled_ranks: list[int]) -> None:
        launched = detach_launched_ranks(trainer)
        save_last_checkpoint(trainer)
        saved = f", saved {trainer.checkpoint_callback.last_model_path}" if trainer.checkpoint_callback else ""
        report(
            f"rank {trainer.global_rank}: SIGTERM on rank {', '.join(map(str, signalled_ranks))}: stopped at step"
            f" {trainer.global_step}{saved}; exiting with {PREEMPTED_EXIT_CODE} (resume with --ckpt_path last)"
        )
        wait_for(launched, trainer)
        raise Preempted


def save_last_checkpoint(trainer: Trainer) -> None:
    """Saves ``last.ckpt`` on every rank's call (rank 0 writes, then all wait), as ModelCheckpoint's ``save_last``."""
    callback = trainer.checkpoint_callback
    if callback is None or callback.dirpath is None:
        trainer.strategy.barrier("preempted")
        return
    path = os.path.join(callback.dirpath, callback.CHECKPOINT_NAME_LAST + callback.FILE_EXTENSION)
    callback.last_model_path = path  # before saving: it is part of the callback's saved state
    trainer.save_checkpoint(path, callback.save_weights_only)


def detach_launched_ranks(trainer: Trainer) -> list[subprocess.Popen]:
    """Takes the ranks Lightning's launcher started out of its watch, for rank 0 to wait for them itself.

    Lightning's launcher thread SIGKILLs rank 0 once a launched rank exits non-zero; it watches the launcher's
    ``procs`` list, so emptying that list (before the save, which the other ranks must wait for) stops it.
    """
    procs = internals.launched_processes(trainer)
    if procs is None:
        return []
    launched = list(procs)
    procs.clear()
    return launched


def wait_for(launched: list[subprocess.Popen], trainer: Trainer) -> None:
    """Rank 0 exits after the ranks it launched, so the command ends when every rank has ended."""
    deadline = time.monotonic() + LAUNCHED_RANKS_EXIT_S
    for local_rank, proc in enumerate(launched, start=1):
        rank = trainer.node_rank * trainer.num_devices + local_rank
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            report(f"rank {rank} (pid {proc.pid}) did not exit {LAUNCHED_RANKS_EXIT_S:.0f} s after stopping: killed")
            proc.kill()
            continue
        if code != PREEMPTED_EXIT_CODE:
            report(f"rank {rank} (pid {proc.pid}) exited with code {code}, not {PREEMPTED_EXIT_CODE}")
