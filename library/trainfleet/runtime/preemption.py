"""Preemption, requeue and Ctrl-C: on SIGTERM, SLURM's requeue signal or SIGINT (Ctrl-C) to any rank, every rank stops
at the same step and ``last.ckpt`` is saved; on the requeue signal the job is requeued too. The run exits 143 (130
after Ctrl-C); a second Ctrl-C stops it at once, without saving.

SLURM (``scancel``, a time limit, preemption) and Kubernetes (eviction, a deleted pod) send SIGTERM, then
SIGKILL after a grace period. Lightning 2.6 handles SIGTERM with two private pieces that this file replaces (through
``lightning_internals.take_over_signals``):

- ``_TrainingEpochLoop._broadcast_sigterm_tensor``: a broadcast and an ``.item()`` at the start of every training
  step of a multi-process run (Lightning-AI/pytorch-lightning#21487): one collective per step, and on GPUs one
  host-device sync per step, which stalls the asynchronous pipeline. Here it does nothing.
- ``_SignalConnector._sigterm_notifier_fn``: the SIGTERM handler, which broadcasts from inside the handler, where it
  pairs with whatever collective the other ranks are in (SIGTERM to rank 0 alone hung a 2-process run for the whole
  process-group timeout); and a run stopped that way exits 0, as if it had finished. Here it only sets a flag.

Every ``check_every_n_steps`` training steps, at the same step on every rank, the ranks sum their flags over a CPU
(gloo) group: a host-side exchange, never a GPU sync. When any rank was signalled, every rank stops after that step,
rank 0 saves ``last.ckpt`` through ModelCheckpoint's path and the checkpoint IO (atomic, RNG states included), and
every process exits with ``PREEMPTED_EXIT_CODE``. The same exchange carries each rank's own step time, which names a
slow rank (``slow_rank.py``): the tensor holds the flags, then each rank's own microseconds a step.

SLURM's time-limit warning (``#SBATCH --signal=SIGUSR1@120`` in ``scripts/slurm.sbatch``) goes the same way. Lightning's
own handler (``_SignalConnector._slurm_sigusr_handler_fn``) saves ``hpc_ckpt_N.ckpt`` from inside the signal handler,
in the middle of a step and of whatever collective the ranks are in: it hung a 2-node job for the process-group
timeout, and a requeued job resumed one optimizer step short. Here the handler only sets a flag; at the next agreed
step every rank stops, rank 0 saves ``last.ckpt``, requeues the job (``scontrol requeue``) while every rank waits, and
every process exits. The requeued job resumes from its run's ``last.ckpt`` (``runs/folders.py``).

Ctrl-C (SIGINT: a terminal sends it to every process of the command, ``kill -INT`` to one) goes the same way, with exit
code 130. Lightning handles no SIGINT: Python raises KeyboardInterrupt wherever the rank is, Lightning's
``_call_and_handle_interrupt`` reports it and exits 1, and nothing is saved. Here the first Ctrl-C sets a flag; a
second one, or one before the first training step (nothing to save yet), raises ``Interrupted``: the ranks this
process launched are killed at once and the process exits 130 without saving (an interrupted checkpoint write leaves
the previous file, checkpoints/files.py). A DataLoader worker forked from a rank lets the first Ctrl-C pass (its
rank decides) and ends on the second.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType
from typing import Any, Protocol

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet import lightning_internals as internals
from trainfleet import program
from trainfleet.checkpoints.last import save_last_checkpoint
from trainfleet.exit_codes import INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE
from trainfleet.runs.folders import resume_command, slurm_job_id
from trainfleet.runtime.early_interrupt import EarlyInterrupt
from trainfleet.runtime.faults import Stopped, finish_pending_save, report
from trainfleet.runtime.requeue_signal import EarlyRequeueSignal
from trainfleet.runtime.slow_rank import StepTimes
from trainfleet.runtime.strategy import process_group_timeout

SIGTERM_FLAG, REQUEUE_FLAG, INTERRUPT_FLAG = 1, 2, 4  # a rank's flags, summed across ranks: each writes its own slot
PERIODIC_FLAG = 8  # rank 0's: a periodic checkpoint is due (checkpoints/periodic.py), told in the same exchange


class PeriodicSave(Protocol):
    """What this check asks of the periodic checkpoint (checkpoints/periodic.py, which imports this module)."""

    def due(self) -> bool: ...

    def save(self, trainer: Trainer) -> None: ...


# How long rank 0 waits for the ranks it launched to exit after a stop (they only tear down), before killing them.
LAUNCHED_RANKS_EXIT_S = 30.0


class Preempted(Stopped):
    """Every rank stopped on SIGTERM, the requeue signal or Ctrl-C after saving; ends the process with CODE."""

    def __init__(self, code: int = PREEMPTED_EXIT_CODE) -> None:
        super().__init__(code)


class Interrupted(Stopped):
    """Ctrl-C again, or before the first training step: this rank stops at once without saving (WHEN says which);
    ends the process with ``INTERRUPTED_EXIT_CODE``."""

    def __init__(self, when: str) -> None:
        super().__init__(INTERRUPTED_EXIT_CODE)
        self.when = when


class PreemptionCheck(Callback):
    """On SIGTERM, SLURM's requeue signal or Ctrl-C to any rank, every rank stops at the same step and saves.

    The signal flags, their exchange every ``check_every_n_steps`` steps, and the stop: the ``preemption`` config key.
    The CLI adds it after the template's other callbacks: the stop comes after the step's other work (the NaN check,
    the logs), and on a failure after ``FailFast`` has stopped the ranks.

    Args:
        check_every_n_steps: how often the ranks exchange their signal flags. A stop comes at most this many steps
            after the signal: keep steps x this well under the scheduler's grace period.
    """

    def __init__(self, check_every_n_steps: int = 50) -> None:
        if check_every_n_steps < 1:
            raise ValueError(f"preemption.check_every_n_steps must be >= 1, got {check_every_n_steps}")
        self.check_every_n_steps = check_every_n_steps
        self.signalled = 0
        self._steps = 0
        self._group: dist.ProcessGroup | None = None
        self._launched: list[subprocess.Popen] = []  # taken out of Lightning's watch by a stop
        self._pid, self._announce, self._previous_sigint = 0, False, None
        self.periodic: PeriodicSave | None = None  # registers itself: its clock is read at this check's exchanges
        self.step_times = StepTimes()  # each rank's own work a step, carried by the same exchange

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self.install(trainer)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.step_times.epoch_start()

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.step_times.batch_start()

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor) -> None:
        self.step_times.before_backward()

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.after_step(trainer)
        self.step_times.batch_end()  # after the check: its save and exchange are not this rank's own work

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, (Interrupted, KeyboardInterrupt)):  # Ctrl-C again, or before the first step
            self.stop_at_once(trainer, exception)
        else:  # after the stop (Preempted) or a failure, which FailFast has reported
            self.restore_interrupt_handler()

    def install(self, trainer: Trainer) -> None:
        """In ``setup("fit")`` on every rank: after the process group, before Lightning registers handlers."""
        EarlyInterrupt.disarm()  # Ctrl-C is this check's from now on
        self.signalled, self._steps, self._launched, self._group = 0, 0, [], None
        self.step_times = StepTimes()  # this fit's: its hosts, once gathered, and the slow ranks it names
        self._pid, self._announce = os.getpid(), trainer.local_rank == 0  # a terminal's Ctrl-C reaches local rank 0
        self._previous_sigint = signal.getsignal(signal.SIGINT)
        # SIGINT ignored (a background job, nohup) stays ignored, as Python leaves it; signals go to the main thread.
        on_interrupt = self._on_interrupt if self._previous_sigint != signal.SIG_IGN else None
        if threading.current_thread() is not threading.main_thread():
            on_interrupt = None
        internals.take_over_signals(
            trainer, on_sigterm=self._on_sigterm, on_requeue=self._on_requeue, on_interrupt=on_interrupt
        )
        EarlyRequeueSignal.check = self  # first: a signal from now on reaches this check
        if EarlyRequeueSignal.received:
            self.signalled, EarlyRequeueSignal.received = REQUEUE_FLAG, False
        if trainer.world_size > 1:  # every rank creates the group, as new_group requires
            gloo = dist.get_backend() == dist.Backend.GLOO
            timeout = process_group_timeout(trainer.strategy)
            self._group = dist.group.WORLD if gloo else dist.new_group(backend=dist.Backend.GLOO, timeout=timeout)
            self.step_times.gather_hosts(self._group, trainer.world_size)  # once, not per check

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signalled |= SIGTERM_FLAG  # nothing else: no I/O, no collective inside a signal handler

    def _on_requeue(self, signum: int, frame: FrameType | None) -> None:
        self.signalled |= REQUEUE_FLAG

    def _on_interrupt(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:  # a DataLoader worker forked from this rank: it ends on the second Ctrl-C
            if self.signalled & INTERRUPT_FLAG:
                raise KeyboardInterrupt  # torch's worker loop ends quietly on it
            self.signalled |= INTERRUPT_FLAG
            return
        if self.signalled & INTERRUPT_FLAG:
            raise Interrupted("Ctrl-C again")
        if self._steps == 0:
            raise Interrupted("Ctrl-C before the first training step")
        self.signalled |= INTERRUPT_FLAG
        if self._announce:  # os.write: the handler may run while the main thread is inside a write to stderr
            within = "after this step" if self._group is None else f"within {self.check_every_n_steps} steps"
            message = (
                f"{program.prefix()} Ctrl-C: every rank stops {within} and saves last.ckpt;"
                " Ctrl-C again to stop at once without saving\n"
            )
            os.write(sys.stderr.fileno(), message.encode())

    def restore_interrupt_handler(self) -> None:
        """SIGINT's previous handler, after an exception (Lightning's teardown restores it after a registration)."""
        if self._previous_sigint is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, self._previous_sigint)

    def stop_at_once(self, trainer: Trainer, exception: BaseException) -> None:
        """After ``Interrupted``, or a KeyboardInterrupt before ``install``: the ranks this process launched are
        killed, without waiting, and nothing is saved."""
        self.restore_interrupt_handler()
        for proc in [*self._launched, *detach_launched_ranks(trainer)]:  # out of Lightning's watch: it would kill
            proc.kill()  # this process too
        if not isinstance(exception, Interrupted):  # before install: Lightning's handling would exit 1
            report(f"rank {trainer.global_rank}: Ctrl-C at step {trainer.global_step}: stopped without saving")
            raise Interrupted("Ctrl-C before the first training step") from exception
        report(
            f"rank {trainer.global_rank}: {exception.when}: stopped at step {trainer.global_step} without saving"
            f" (the last checkpoint written stays); exiting with {INTERRUPTED_EXIT_CODE}"
        )
        last = trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else ""
        if trainer.is_global_zero and last and os.path.exists(last):
            report(f"resume from {last} with: {resume_instructions(trainer)}")

    def after_step(self, trainer: Trainer) -> None:
        """After each training step: on a check step, stop every rank if any rank was signalled, else save the
        periodic checkpoint if rank 0's clock says it is due."""
        self._steps += 1
        if self._group is None:  # one process: nothing to agree on, so every step
            if self.signalled:
                self._stop(trainer, [self.signalled])
        elif self._steps % self.check_every_n_steps == 0:
            due = self.periodic is not None and trainer.is_global_zero and self.periodic.due()
            world = trainer.world_size
            exchanged = torch.zeros(2 * world, dtype=torch.int32)  # one collective: the flags, then the step times
            exchanged[trainer.global_rank] = self.signalled | (PERIODIC_FLAG if due else 0)
            exchanged[world + trainer.global_rank] = self.step_times.window_microseconds()
            dist.all_reduce(exchanged, group=self._group)
            flags, microseconds = exchanged[:world], exchanged[world:].tolist()
            self.step_times.report(microseconds, self.check_every_n_steps, trainer.global_step, trainer.is_global_zero)
            stops = [flag & ~PERIODIC_FLAG for flag in flags.tolist()]
            if any(stops):  # the stop saves last.ckpt
                self._stop(trainer, stops)
            elif self.periodic is not None and flags[0] & PERIODIC_FLAG:
                self.periodic.save(trainer)

    def _stop(self, trainer: Trainer, flags: list[int]) -> None:
        self._launched = detach_launched_ranks(trainer)
        save_last_checkpoint(trainer)
        finish_pending_save(trainer)  # FSDP2 writes in the background: on disk before the job is requeued or exits
        requeue = any(flag & REQUEUE_FLAG for flag in flags)
        sigterm = any(flag & SIGTERM_FLAG for flag in flags)
        code = PREEMPTED_EXIT_CODE if requeue or sigterm else INTERRUPTED_EXIT_CODE
        if requeue:
            requeued = trainer.strategy.broadcast(requeue_slurm_job() if trainer.is_global_zero else None)
            next_step = f"job {requeued} requeued: it resumes by itself" if requeued else "requeue failed: resubmit it"
        else:
            next_step = "resume with --ckpt_path last"
        saved = f", saved {trainer.checkpoint_callback.last_model_path}" if trainer.checkpoint_callback else ""
        signalled = [f"rank {rank}" for rank, flag in enumerate(flags) if flag] if len(flags) > 1 else ["this rank"]
        cause = "the requeue signal" if requeue else "SIGTERM" if sigterm else "Ctrl-C"
        report(
            f"rank {trainer.global_rank}: {cause} on {', '.join(signalled)}:"
            f" stopped at step {trainer.global_step}{saved}; {next_step}; exiting with {code}"
        )
        if trainer.is_global_zero and not requeue and trainer.checkpoint_callback:
            report(f"resume with: {resume_instructions(trainer)}")
        wait_for(self._launched, trainer, code)
        raise Preempted(code)


def resume_instructions(trainer: Trainer) -> str:
    """The command that resumes this run; ranks started by torchrun, srun or a cluster are started by it again."""
    command = resume_command(sys.argv)
    environment = getattr(trainer.strategy, "cluster_environment", None)  # one process: none
    if environment is None or isinstance(environment, LightningEnvironment):  # started by this command
        return command
    return f"the same launch, each process running {command}"


def requeue_slurm_job() -> str | None:
    """``scontrol requeue`` of this SLURM job (or array task); its id, or None when it could not be requeued."""
    job = slurm_job_id()
    if job is None:
        report("the requeue signal outside a SLURM job: not requeued")
        return None
    # The requeue terminates the job's processes, scontrol among them, at times before its reply arrives (a CI run: the
    # job was requeued and scontrol died of SIGTERM): it runs with SIGTERM ignored, which exec keeps.
    requeue = ["sh", "-c", 'trap "" TERM; exec scontrol requeue "$0"', job]
    try:
        done = subprocess.run(requeue, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        report(f"scontrol requeue {job} failed: {error}")
        return None
    if done.returncode != 0:
        report(f"scontrol requeue {job} failed ({done.returncode}): {done.stderr.strip()}")
        return None
    return job


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


def wait_for(launched: list[subprocess.Popen], trainer: Trainer, expected: int) -> None:
    """Rank 0 exits after the ranks it launched, so the command ends when every rank has ended (with EXPECTED)."""
    deadline = time.monotonic() + LAUNCHED_RANKS_EXIT_S
    for local_rank, proc in enumerate(launched, start=1):
        rank = trainer.node_rank * trainer.num_devices + local_rank
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            report(f"rank {rank} (pid {proc.pid}) did not exit {LAUNCHED_RANKS_EXIT_S:.0f} s after stopping: killed")
            proc.kill()
            continue
        if code != expected:
            report(f"rank {rank} (pid {proc.pid}) exited with code {code}, not {expected}")
