"""Starting the local ranks: forked from rank 0 once it has built everything, instead of re-running the command.

Lightning's launcher starts local ranks 1..n-1 by re-running the command line: each rank imports torch and
Lightning again and parses and builds everything again, after rank 0 has done all of it, so a 2-process run reaches
its first step seconds after a 1-process run (docs/performance.md). A forked rank starts at once,
with rank 0's parsed config, model and data module (copied on write), and joins the process group like a
re-run one: the environment variables, the process bookkeeping and the watch over the ranks are Lightning's own.

Two things cannot cross a fork: torch's OpenMP pool (libgomp hangs in a child forked after a multi-threaded parallel
region) and CUDA (unusable in a child forked after it started). So the CLI builds inside ``one_thread()``, and uses
this launcher on CPU only, where Lightning would use its script launcher; GPU ranks are started by Lightning's.
Lightning's own ``ddp_fork`` is another design: the launching process forks every rank, rank 0 included, and waits
for rank 0's results through a queue.
"""

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from trainfleet import lightning_internals as internals
from trainfleet.runs.failures import report_crash
from trainfleet.runtime import faults, process_exit, rendezvous


class ForkedRank:
    """A forked rank, looked after through the ``subprocess.Popen`` methods Lightning's launcher and ours call."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not faults.wait_until(lambda: self.poll() is not None, float("inf") if timeout is None else timeout):
            raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkLauncher(internals.ScriptLauncher):
    """Lightning's script launcher, with the local ranks forked from rank 0 instead of re-run."""

    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if self.cluster_environment.creates_processes_externally:  # torchrun, SLURM: every rank is started already
            return super().launch(function, *args, trainer=trainer, **kwargs)
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        internals.check_can_spawn_children(self)
        self._set_launch_environment()
        for local_rank in range(1, self.num_processes):
            sys.stdout.flush(), sys.stderr.flush()  # a buffered line would be printed by both processes
            pid = os.fork()
            if pid == 0:
                self._run_forked_rank(local_rank, trainer, function, *args, **kwargs)  # never returns
            self.procs.append(ForkedRank(pid))
        internals.watch_launched(self.procs)
        internals.set_num_threads(self.num_processes)
        return function(*args, **kwargs)

    def _set_launch_environment(self) -> None:
        """What Lightning's launcher sets before it starts the other ranks, read by every rank's environment."""
        os.environ["MASTER_ADDR"] = self.cluster_environment.main_address
        os.environ["MASTER_PORT"] = str(self.cluster_environment.main_port)
        os.environ["NODE_RANK"] = str(self.cluster_environment.node_rank())
        os.environ["LOCAL_RANK"] = "0"
        os.environ["WORLD_SIZE"] = str(self.num_processes * self.num_nodes)

    def _run_forked_rank(self, local_rank: int, trainer: Any, function: Callable, *args: Any, **kwargs: Any) -> None:
        """The forked rank's whole life: it runs the trainer's function and exits, never returning into the caller
        (which may be a notebook or pytest: a re-run rank would have run only the command)."""
        os.environ["LOCAL_RANK"] = str(local_rank)
        self.procs = []  # the launcher's bookkeeping stays in rank 0
        faults.LAUNCHER_PID = os.getppid()
        # A re-run rank reads it from the environment at import; Lightning sets it again once the group is up.
        rank_zero_only.rank = self.cluster_environment.node_rank() * self.num_processes + local_rank
        internals.set_num_threads(self.num_processes)
        # Rebuilds torch's thread pool here, while this process has one thread: torch marks the parent's as lost at
        # the fork, and two threads rebuilding it at once (the autograd engine's, this one) crashed a rank.
        torch.set_num_threads(torch.get_num_threads())
        code = 0
        try:  # as in rank 0: Lightning's handling (callbacks' on_exception, teardown), then this launcher's again
            internals.run_as_trainer(trainer, function, *args, **kwargs)  # LOCAL_RANK is set: no launch
        except SystemExit as stop:
            code = process_exit.exit_code(stop)
        except rendezvous.StartupFailed as error:  # reported by local rank 0
            code = error.exit_code
        except BaseException:
            report_crash(*sys.exc_info())  # as an uncaught exception ends a process, the traceback in a file
            code = 1
        finally:
            process_exit.exit_now(code)


@contextmanager
def one_thread() -> Iterator[None]:
    """Builds on one thread: a rank forked after a multi-threaded OpenMP region hangs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)  # sets the count only: no thread starts before the first parallel op
