"""Warm restarts: a failed run starts again in processes that have imported torch and Lightning already.

A launcher's restart (torchrun's ``--max-restarts``, a new srun step) starts new interpreters, which import torch and
Lightning again: 6-7 s of the 8 s a restart took (docs/fault-tolerance.md). With ``PROJECT_WARM_RESTARTS=N``
(scripts/torchrun.sh and scripts/slurm.sbatch set it), each process the launcher starts for ``fit`` imports what a
run needs, forks its rank and supervises it. When a rank fails (exit 1 or a signal: a crash, a kill, a hang ended at
the process-group timeout), every supervisor ends its rank and forks the next attempt, which resumes from the run's
newest checkpoint as after a launcher's restart, up to N times. A final exit code (a refusal, the NaN guard, a full
disk, Ctrl-C, SIGTERM: ``exit_codes.FINAL_EXIT_CODES``) ends the supervisor with it, and the launcher ends the rest.

The supervisors share a TCP store at MASTER_ADDR:MASTER_PORT: torchrun's agent's, or under SLURM one the supervisor
of rank 0 serves (from a process of its own), where the ranks then meet as under torchrun
(``rendezvous.attempt_store``); a one-task SLURM job has nobody to agree with, and its rank serves its own. The
first cause of an attempt's failure is written there (``say_failed``: by the rank that saw it, else by its
supervisor); every supervisor learns it from a wait in the store (no polling: a thousand supervisors cost the store
nothing while the run trains), and gives its rank ``GRACE_S`` to end by itself, then kills it: a rank hung on another
machine ends within seconds, not after the launcher's grace of 30 s. A rank still writing a checkpoint then (the
failed rank finishing its background save) is given up to ``SAVE_GRACE_S`` more; cut past it, the write leaves the
previous checkpoint whole (atomic saves), and the supervisor says so.

The fork is safe because the supervisor has run nothing but imports: no CUDA (checked: the rank runs in place, with
the launcher's restarts only, if CUDA has started), no OpenMP pool. Signals reach the rank as they would reach a
launched process: a terminal, srun and torchrun signal the whole process group, which the rank shares; a rank dies
with its supervisor (``PR_SET_PDEATHSIG``, Linux only).
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from datetime import timedelta
from types import FrameType

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

from trainfleet.checkpoints import writing
from trainfleet.exit_codes import FINAL_EXIT_CODES
from trainfleet.messages import report
from trainfleet.runs import restarts
from trainfleet.runtime import process_exit, rendezvous
from trainfleet.runtime.early_interrupt import EarlyInterrupt
from trainfleet.runtime.requeue_signal import EarlyRequeueSignal
from trainfleet.runtime.strategy import STARTUP_TIMEOUT

BUDGET_VAR = "PROJECT_WARM_RESTARTS"
POLL_S = 0.05  # for the rank's own end (waitpid), never the store
GRACE_S = 5.0  # for a rank whose peer failed to fail by itself (a dropped connection) before it is killed
SAVE_GRACE_S = 120.0  # more, for a rank still writing a checkpoint
WAIT_FOREVER = timedelta(days=365)  # a supervisor waits in the store for its attempt's failure for the run's life
STORE_TIMEOUT = STARTUP_TIMEOUT  # for the supervisors to meet: the strategy's default
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
PR_SET_PDEATHSIG = 1


def requested(argv: list[str]) -> bool:
    """``fit`` started by torchrun or srun, on Linux, with a warm-restart budget."""
    return (
        argv[:1] == ["fit"]
        and os.environ.get(BUDGET_VAR, "").isdigit()
        and sys.platform == "linux"
        and (TorchElasticEnvironment.detect() or SLURMEnvironment.detect())
    )


def supervise() -> None:
    """Returns in each forked rank; the supervisor ends its process with the run's exit code."""
    if torch.cuda.is_initialized():
        report("warm restarts off: CUDA started before the rank was forked; the launcher restarts it")
        return
    Supervisor(_shared_store(), int(os.environ[BUDGET_VAR])).run()


def say_failed(cause: str, failed_at: float | None = None) -> None:
    """A rank's cause of its attempt's failure, for the supervisors (the first said wins); nothing without them.
    FAILED_AT: when the failure began (``time.time()``; a hung rank's last heartbeat), by default now."""
    supervised = os.environ.get(BUDGET_VAR) is not None and restarts.WARM_GENERATION_VAR in os.environ
    if not supervised or rendezvous.attempt_prefix() is None:  # no store shared with the supervisors
        return
    with contextlib.suppress(RuntimeError, ValueError, KeyError):  # the store's host is gone: its supervisor says it
        store = rendezvous.client_store(timedelta(seconds=5))
        _failed(dist.PrefixStore(_prefix(), store), restarts.warm_generation(), cause, failed_at)


class Supervisor:
    """Forks its rank, attempt after attempt, until one ends for good or the budget is spent."""

    def __init__(self, store: dist.Store, budget: int) -> None:
        self.store, self.budget = store, budget
        self.rank = int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)
        self.stopping = False  # a stop signal came: the attempt running ends for good
        self.waited_for_save = False  # said once per failure that the rank is given time to finish its checkpoint
        self.known_at: dict[int, float] = {}  # per attempt: when this supervisor knew it failed (``time.time()``)

    def run(self) -> None:
        EarlyInterrupt.disarm()  # the supervisor waits for its rank's own stop, however long its save takes
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_stop)
        generation = 0
        while True:
            pid = self._fork(generation)
            if pid == 0:
                return
            code, killed_here = self._watch(pid, generation)
            if code == 0 or code in FINAL_EXIT_CODES or self.stopping:
                process_exit.exit_now(_status(code))
            cause = self._cause(generation, code, killed_here)
            self._pass_on_timing(generation)
            if generation >= self.budget:
                report(f"rank {self.rank}: the warm-restart budget is spent ({self.budget}); last failure: {cause}")
                process_exit.exit_now(_status(code))
            generation += 1
            if self.rank == 0:
                restarts.record_outcome("restart", cause)  # counted by scripts/slurm.sbatch
                report(f"warm restart {generation} of {self.budget}, in the same processes: {cause}")
            os.environ[restarts.RESTART_CAUSE_VAR] = cause

    def _fork(self, generation: int) -> int:
        sys.stdout.flush(), sys.stderr.flush()  # a buffered line would be printed by both processes
        writing.reset()
        pid = os.fork()
        if pid == 0:  # the rank: signals as a started process has them, and the attempt it is
            _die_with_parent()
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            EarlyRequeueSignal.catch()
            EarlyInterrupt.catch()
            os.environ[restarts.WARM_GENERATION_VAR] = str(generation)
        return pid

    def _watch(self, pid: int, generation: int) -> tuple[int, bool]:
        """Waits for the rank to end; kills it ``GRACE_S`` after a peer's failure (longer while it finishes a
        checkpoint: ``_may_end``). Returns its exit code, and whether this supervisor killed it. The store is not
        polled: a thread waits in it for the attempt's failure (``_failure_seen``); the rank's own state is local."""
        failed = self._failure_seen(generation)
        failed_at, killed_here, self.waited_for_save = None, False, False
        while True:
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                self.known_at.setdefault(generation, time.time())  # unless a peer's failure was known before
                return os.waitstatus_to_exitcode(status), killed_here
            if failed_at is None and failed.is_set():
                failed_at = time.monotonic()
            # A rank that has ended is reaped, not killed.
            ending = failed_at is not None and process_state(pid) not in ("Z", "")
            if not killed_here and ending and self._may_end(pid, time.monotonic() - failed_at):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed_here = True
            time.sleep(POLL_S)

    def _failure_seen(self, generation: int) -> threading.Event:
        """Set once the attempt's failure is written: a thread blocks in the store's ``wait`` (the server answers when
        the key is set), on a connection of its own, so that the supervisor's other requests do not queue behind it."""
        seen = threading.Event()

        def wait() -> None:
            with contextlib.suppress(RuntimeError):  # the store's host has ended: the launcher ends this process
                self.store.clone().wait([f"failed/{generation}"], WAIT_FOREVER)
                self.known_at.setdefault(generation, time.time())
                seen.set()

        threading.Thread(target=wait, name=f"failure-of-attempt-{generation}", daemon=True).start()
        return seen

    def _may_end(self, pid: int, since_failure: float) -> bool:
        """Whether the rank may be killed now: ``GRACE_S`` after the failure, or, while it writes a checkpoint (a
        background save the failing rank finishes before it exits), once the write is done, a stopped rank's at once,
        or after ``SAVE_GRACE_S``, when the cut write leaves the previous checkpoint whole (atomic saves)."""
        if since_failure <= GRACE_S:
            return False
        if not writing.in_progress():
            return True
        if _is_stopped(pid) or since_failure > GRACE_S + SAVE_GRACE_S:
            report(
                f"rank {self.rank}: killed while writing a checkpoint ({since_failure:.0f} s after the failure); the"
                " write is cut, the previous checkpoint stays whole and the next attempt resumes from it"
            )
            return True
        if not self.waited_for_save:
            self.waited_for_save = True
            report(f"rank {self.rank}: finishing the checkpoint it writes before it ends (up to {SAVE_GRACE_S:.0f} s)")
        return False

    def _cause(self, generation: int, code: int, killed_here: bool = False) -> str:
        """The attempt's cause of failure, the same for every supervisor: a rank killed from outside (not by this
        supervisor, nor by a peer that named it as hung) is the cause, whatever its peers said of their dropped
        connections; otherwise the first said."""
        mine = f"rank {self.rank} {_ended(code)}"
        if code >= 0 or killed_here:
            return _failed(self.store, generation, mine)
        with contextlib.suppress(RuntimeError):
            said = self.store.get(f"failed/{generation}").decode() if self._has_failed(generation) else ""
            if said.startswith(f"rank {self.rank} stopped"):
                return said
            _stamp_failure(self.store, generation, None)  # before the cause, which wakes the other supervisors
            self.store.set(f"failed/{generation}", mine)
        return mine

    def _pass_on_timing(self, generation: int) -> None:
        """Tells the next attempt when the failure of GENERATION began and when it was known here, for the run's
        goodput record (runs/goodput.py): environment variables its rank is forked with, as the cause is."""
        os.environ.pop(restarts.FAILED_AT_VAR, None)
        with contextlib.suppress(RuntimeError):  # the store's host is gone: the failure's start is not known
            if self.store.check([f"failed_at/{generation}"]):  # a get would wait for it
                os.environ[restarts.FAILED_AT_VAR] = self.store.get(f"failed_at/{generation}").decode()
        os.environ[restarts.KNOWN_AT_VAR] = repr(self.known_at.get(generation, time.time()))

    def _has_failed(self, generation: int) -> bool:  # once, after the rank has ended
        try:
            return self.store.check([f"failed/{generation}"])
        except RuntimeError:  # the store's host has ended (rank 0's run ended for good): the launcher ends this one
            return False

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True


def _failed(store: dist.Store, generation: int, cause: str, failed_at: float | None = None) -> str:
    """Writes CAUSE as the attempt's failure unless one was written first; returns the one that stands."""
    try:
        _stamp_failure(store, generation, failed_at)  # first: a supervisor woken by the cause then finds the time
        return store.compare_set(f"failed/{generation}", "", cause).decode()
    except RuntimeError:
        return cause


def _stamp_failure(store: dist.Store, generation: int, failed_at: float | None) -> None:
    """Records when the attempt's failure began, by whoever saw it first (FAILED_AT, or now)."""
    store.compare_set(f"failed_at/{generation}", "", repr(failed_at or time.time()))


def _status(code: int) -> int:
    """The exit status that says what ended the rank: 128 + N for signal N, as a shell reports it."""
    return 128 - code if code < 0 else code


def _ended(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


def _shared_store() -> dist.Store:
    """The store every supervisor of the run reaches (see the module's docstring)."""
    if TorchElasticEnvironment.detect():
        store = rendezvous.client_store(STORE_TIMEOUT)
    else:
        environment = SLURMEnvironment()
        if environment.world_size() == 1:  # nobody to agree with: the rank serves its own store, as unsupervised
            return dist.HashStore()
        member = rendezvous.Member(
            environment.global_rank(),
            environment.world_size(),
            environment.node_rank(),
            environment.local_rank(),
            int(os.environ.get("SLURM_NNODES") or 1),
        )
        address, port = environment.main_address, environment.main_port
        if member.rank == 0:
            _serve_apart(address, port, member)
        store = rendezvous.open_store(address, port, member, STORE_TIMEOUT, serve=False)
        # The ranks meet in this store, as under torchrun's agent (rendezvous.attempt_store).
        os.environ.update(MASTER_ADDR=address, MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    return dist.PrefixStore(_prefix(), store)


def _serve_apart(address: str, port: int, member: rendezvous.Member) -> None:
    """Serves the store from a process of its own, which ends with this one: a store's threads do not cross the fork
    of a rank (its copy aborted the rank). Raises ``StartupFailed`` as the serving process measured it."""
    reader, writer = os.pipe()
    if os.fork() == 0:
        os.close(reader)
        _die_with_parent()
        for signum in STOP_SIGNALS:  # the ranks stopping on them still use the store
            signal.signal(signum, signal.SIG_IGN)
        try:
            store = rendezvous.open_store(address, port, member, STORE_TIMEOUT, serve=True)
        except rendezvous.StartupFailed as error:
            os.write(writer, f"{error.exit_code} {error}".encode())
            process_exit.exit_now(0)
        os.close(writer)
        while store:
            time.sleep(3600)
    os.close(writer)
    with os.fdopen(reader) as pipe:
        failed = pipe.read()
    if failed:
        code, message = failed.split(" ", 1)
        raise rendezvous.StartupFailed(message, int(code))


def process_state(pid: int) -> str:
    """PID's state letter in /proc (Z: ended, not reaped yet; T: stopped), "" where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rpartition(")")[2].split()[0]
    except OSError:
        return ""


def _is_stopped(pid: int) -> bool:
    """Whether PID is stopped (SIGSTOP, a debugger): it cannot finish a write."""
    return process_state(pid) in ("T", "t")


def _die_with_parent() -> None:
    """This forked process is killed when its parent ends (Linux's ``PR_SET_PDEATHSIG``), or ends now if it has."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the line above
        process_exit.exit_now(1)


def _prefix() -> str:
    return f"/project/warm_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
