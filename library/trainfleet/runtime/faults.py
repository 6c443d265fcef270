"""When a run goes wrong: name the failed rank, stop every process of the run, name the rank that hangs (a NaN loss:
``nan_guard.py``).

Distributed failures otherwise read as a peer's "Connection reset by peer", or as a hang: a rank blocked in a
collective waits for the process-group timeout (``trainer.strategy.init_args.timeout``), then fails with a message
that does not say which peer never came.
"""

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet import lightning_internals as internals
from trainfleet.exit_codes import FINAL_EXIT_CODES, exit_code_for, is_disk_full
from trainfleet.messages import first_line, report
from trainfleet.runs.folders import resume_command
from trainfleet.runs.restarts import record_outcome
from trainfleet.runtime import rendezvous, warm_restart
from trainfleet.runtime.rendezvous import StartupFailed
from trainfleet.runtime.strategy import process_group_timeout

# The process that started this one: for a rank that Lightning's launcher re-ran, rank 0 (launcher.py sets it in a
# forked rank). Recorded at import, before a failure to join the process group can come.
LAUNCHER_PID = os.getppid()
DIST_HINT = (
    "every process must start with the same num_nodes and devices, reach MASTER_ADDR:MASTER_PORT, and join within"
    " trainer.strategy.init_args.timeout; `python -m project doctor` checks the setup"
)


class Stopped(SystemExit):
    """A deliberate stop (preemption, Ctrl-C: ``runtime/preemption.py``), not a failure: nothing for ``FailFast`` to
    report."""


class FailFast(Callback):
    """On an exception in any rank: say which rank failed and at which step, and stop the ranks it launched; while
    training, each rank's heartbeat (``Heartbeat``), which names the rank that hangs.

    Lightning's own launcher (``devices > 1`` without torchrun or SLURM) starts local ranks 1..n-1 from
    rank 0's process. It kills them only on Ctrl-C; a rank 0 that fails otherwise would leave them blocked
    in a collective. torchrun and srun stop the other ranks themselves (srun with ``--kill-on-bad-exit``).
    The CLI adds it before ``PreemptionCheck``: on a failure the ranks are stopped before SIGINT's handler is restored.
    """

    def __init__(self) -> None:
        self.heartbeat = Heartbeat()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.heartbeat.start(trainer, process_group_timeout(trainer.strategy))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.heartbeat.progressed(trainer.global_step)

    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        self.heartbeat.progressed(trainer.global_step)  # a long validation is not a stall

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.heartbeat.stop()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, (Stopped, KeyboardInterrupt)):  # not a failure: PreemptionCheck ends the run
            self.heartbeat.stop()
        elif isinstance(exception, StartupFailed):  # the ranks never met: reported, and stopped by DDPStrategy
            return
        else:
            record_outcome(exit_code_for(exception), self.report_failure(trainer, exception))

    def report_failure(self, trainer: Trainer, exception: BaseException) -> str:
        """Reports the failure and stops the launched ranks; returns the cause in one line (the hung rank, if any)."""
        noticed = time.time()  # when this rank knew: the failure's start, short of a hang's (goodput's detection)
        where = f"rank {trainer.global_rank}/{trainer.world_size} failed at step {trainer.global_step}"
        cause = f"{where}: {type(exception).__name__}: {first_line(exception)}"
        if is_disk_full(exception):
            cause += f"; once space is freed, resume with: {resume_command(sys.argv)}"
        report(cause)
        if isinstance(exception, torch.distributed.DistError):
            report(f"rank {trainer.global_rank}: {DIST_HINT}")
        suspects = self.heartbeat.suspects(trainer.world_size) if trainer.world_size > 1 else []
        outcome = f"{suspects[0]} ({cause})" if suspects else cause
        if exit_code_for(exception) not in FINAL_EXIT_CODES:  # before the hung are killed: that is not the cause
            began = self.heartbeat.stopped_since(trainer.world_size) if suspects else noticed
            warm_restart.say_failed(outcome, began)
        if suspects:
            suspects += self.heartbeat.kill_stopped_ranks_here(trainer.world_size)
        for line in suspects:
            report(f"rank {trainer.global_rank}: {line}")
        self.heartbeat.stop()
        finish_pending_save(trainer)
        launched = internals.launched_processes(trainer)
        if launched:
            self._stop_launched_ranks(trainer, launched)
        elif trainer.world_size > 1 and trainer.local_rank > 0 and self._launcher_is_gone():
            first_rank = trainer.node_rank * trainer.num_devices
            report(f"rank {first_rank}, the process that launched rank {trainer.global_rank}, is gone")
        return outcome

    def _stop_launched_ranks(self, trainer: Trainer, launched: list) -> None:
        """Names the launched ranks that already ended badly, then kills the rest."""
        wait_until(lambda: any(proc.poll() for proc in launched))
        for local_rank, proc in enumerate(launched, start=1):
            rank = trainer.node_rank * trainer.num_devices + local_rank
            if proc.returncode is not None and proc.returncode < 0:
                report(f"rank {rank} (pid {proc.pid}) was killed by {signal.Signals(-proc.returncode).name}")
            elif proc.returncode:
                report(f"rank {rank} (pid {proc.pid}) exited with code {proc.returncode}")
        internals.kill_launched(trainer, signal.SIGKILL)

    def _launcher_is_gone(self) -> bool:
        return wait_until(lambda: os.getppid() != LAUNCHER_PID)


def finish_pending_save(trainer: Trainer) -> None:
    """A checkpoint still being written in the background (FSDP2's strategy, runtime/sharding.py, or the single-file
    writer, checkpoints/files.py) is finished before the ranks are stopped, if the ranks writing it still can."""
    for writer in (trainer.strategy, trainer.strategy.checkpoint_io):
        finish = getattr(writer, "finish_pending_save", None)
        if finish is None:
            continue
        try:
            finish()
        except Exception as error:  # a peer that died mid-write, a full disk: the previous checkpoint stays
            cause = first_line(error)
            report(f"rank {trainer.global_rank}: the checkpoint being written could not be finished: {cause}")


class Heartbeat:
    """Each rank's last step and when it reached it, written to the process group's store by a thread every
    ``INTERVAL_S`` or more (a node's ranks together at most once a second: the store serves every node); what the
    other ranks read, once and in two requests, when a collective times out, to name the rank that stopped.

    A rank that hangs without dying (SIGSTOP, a dead node, a deadlock outside Python) stops beating; the ranks that
    wait for it in a collective fail at the process-group timeout, then name it, and kill it where it runs on their
    machine: the launcher would wait 30 s for it to act on its SIGTERM (torchrun's grace, SLURM's KillWait). Each
    running rank also prints every thread's stack (``faulthandler``) once when its own steps stall for
    ``STALL_DUMP_FRACTION`` of the timeout: where it waits. (On NCCL, torch's Flight Recorder records the
    collectives: ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``.)
    """

    INTERVAL_S = 2.0  # at least; a node's ranks together beat at most once a second (``start``)
    STALE_AFTER = 3  # intervals: a rank whose beat is older has stopped (the clocks of nodes may differ a little)
    STALL_DUMP_FRACTION = 0.8

    def __init__(self) -> None:
        self.step, self.progress_at = 0, time.monotonic()
        self.interval = self.INTERVAL_S
        self._read_once: tuple[dict[int, Beat], list[int]] | None = None  # the beats, read at the failure
        self._me = ""  # this rank's pid_space() and pid, beside each beat
        self._store: dist.Store | None = None
        self._stopped: threading.Event | None = None  # made at start: callbacks are deep-copied before (EMA)

    def start(self, trainer: Trainer, timeout: timedelta) -> None:
        """On every rank, once the process group is up: connect to its store and beat until the run ends."""
        if trainer.world_size < 2 or "MASTER_ADDR" not in os.environ:
            return
        wait = timedelta(seconds=10)
        # A store kept for every attempt holds the earlier attempts' beats: this attempt's key space only.
        store = rendezvous.attempt_store(wait) or rendezvous.client_store(wait)
        self._store = dist.PrefixStore("project/heartbeat", store)
        self.step, self._me = trainer.global_step, f"{pid_space()} {os.getpid()}"
        # One store serves every node: a node's ranks together beat at most once a second, whatever the run's size.
        self.interval = max(self.INTERVAL_S, float(trainer.num_devices))
        self._store.set(str(trainer.global_rank), self._beat_value())  # the first beat, at once
        self._store.append("ranks", f"{trainer.global_rank},")  # who beats: the failure reads them in one request
        self._stopped = threading.Event()
        self.progress_at = time.monotonic()
        stall_s = timeout.total_seconds() * self.STALL_DUMP_FRACTION
        thread = threading.Thread(target=self._beat, args=(trainer.global_rank, stall_s), daemon=True)
        thread.start()

    def _beat_value(self) -> str:
        return f"{self.step} {time.time()} {self._me}"

    def progressed(self, step: int) -> None:
        self.step, self.progress_at = step, time.monotonic()

    def stop(self) -> None:
        if self._stopped is not None:
            self._stopped.set()

    def _beat(self, rank: int, stall_s: float) -> None:
        dumped_at = None
        while not self._stopped.wait(self.interval):
            with contextlib.suppress(RuntimeError):  # the store's host does not answer: what suspects() reports
                self._store.set(str(rank), self._beat_value())
            stalled = time.monotonic() - self.progress_at
            if stalled > stall_s and dumped_at != self.progress_at:
                dumped_at = self.progress_at
                report(f"rank {rank}: no progress for {stalled:.0f} s at step {self.step}; where each thread waits:")
                faulthandler.dump_traceback(sys.stderr, all_threads=True)

    def suspects(self, world_size: int) -> list[str]:
        """Lines naming the ranks that stopped beating, with their last step."""
        if self._store is None:
            return []
        beats, silent = self._read(world_size)
        if not beats:
            return ["no rank's heartbeat could be read: the store's host (rank 0) has stopped or is gone"]
        stopped = self._stopped_ranks(beats) + silent
        if not stopped:  # every rank still runs: the failure is not a hang
            return []
        lines = [
            f"rank {rank} stopped: its last heartbeat was at step {beats[rank].step}, {beats[rank].age:.0f} s ago"
            if rank in beats
            else f"rank {rank} stopped: no heartbeat from it"
            for rank in sorted(stopped)
        ]
        running = sorted(set(beats) - set(stopped))
        if running:
            steps = ", ".join(f"{rank} at step {beats[rank].step}" for rank in running)
            lines.append(f"ranks still running: {steps}")
        return lines

    def stopped_since(self, world_size: int) -> float | None:
        """When the first rank that stopped beating beat last (``time.time()``): a hang's start, at most an interval
        early, for the goodput record's detection seconds (runs/goodput.py)."""
        beats, _ = self._read(world_size)
        ages = [beats[rank].age for rank in self._stopped_ranks(beats)]
        return time.time() - max(ages) if ages else None

    def kill_stopped_ranks_here(self, world_size: int) -> list[str]:
        """SIGKILLs the stopped ranks that run on this machine (their pids mean the same processes here); lines saying
        which. A hung process does not act on the launcher's SIGTERM: torchrun and srun wait 30 s (SLURM's KillWait)
        before their SIGKILL, and only then restart the run."""
        if self._store is None:
            return []
        beats, _ = self._read(world_size)
        here, lines = pid_space(), []
        for rank in self._stopped_ranks(beats):
            if beats[rank].pid_space == here != "" and is_alive(beats[rank].pid):
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(beats[rank].pid, signal.SIGKILL)
                    lines.append(f"rank {rank} (pid {beats[rank].pid}, on this machine) killed: it hung")
        return lines

    def _read(self, world_size: int) -> tuple[dict[int, "Beat"], list[int]]:
        """Each rank's last beat, and the ranks that never beat or whose beat cannot be read: read once per failure, in
        two requests (who beats, then every beat at once), whatever the number of ranks."""
        if self._read_once is None:
            self._read_once = self._read_all(world_size)
        return self._read_once

    def _read_all(self, world_size: int) -> tuple[dict[int, "Beat"], list[int]]:
        now = time.time()
        try:
            ranks = sorted({int(rank) for rank in self._store.get("ranks").decode().split(",") if rank})
            values = self._store.multi_get([str(rank) for rank in ranks])
        except RuntimeError:  # the store is gone with its host
            return {}, list(range(world_size))
        beats = {}
        for rank, value in zip(ranks, values, strict=True):
            step, at, space, pid = value.decode().split(" ")
            beats[rank] = Beat(int(step), now - float(at), space, int(pid))
        return beats, [rank for rank in range(world_size) if rank not in beats]

    def _stopped_ranks(self, beats: dict[int, "Beat"]) -> list[int]:
        return [rank for rank, beat in beats.items() if beat.age > self.STALE_AFTER * self.interval]


class Beat(NamedTuple):
    step: int
    age: float  # seconds since it was written
    pid_space: str  # where its pid names the rank's process: see pid_space()
    pid: int


def is_alive(pid: int) -> bool:
    """Whether PID is a process that has not ended (a crashed rank its launcher has not reaped yet is a zombie)."""
    return warm_restart.process_state(pid) not in ("Z", "")


def pid_space() -> str:
    """This machine's boot and this process's PID namespace: ranks with the same value see each other's pids (other
    nodes, or containers of one machine, do not). Empty where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return f"{file.read().strip()}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Polls CONDITION for up to TIMEOUT seconds: a dead peer's exit status lags its closed sockets a little."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
