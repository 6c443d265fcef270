"""One run, one writer: the process that owns a run folder holds ``run.lock`` in it for as long as it lives.

Two fits in one run folder (``fit --ckpt_path last`` started twice) would write over each other's checkpoints,
configs and ``metrics.csv``; Lightning's config saving caught them only when they started within seconds of each
other, with a traceback. The owner (global rank 0, or the process that parses the command for it: see ``owns_runs``)
takes an exclusive ``fcntl.flock`` on ``<run folder>/run.lock`` and writes its host, pid and start time into it; a
second fit finds the lock taken and is refused (exit 2) with one line naming the holder, before it writes anything.

The kernel releases a flock when its holder dies, however it dies (SIGKILL, a crash): the file it leaves is stale,
and the next fit takes it over, saying so. A process the holder forks (a local rank, a DataLoader worker) closes its
copy at once (``os.register_at_fork``), so the lock never outlives its holder: a warm restart's next attempt
(runtime/warm_restart.py forks it after the previous one has ended) takes it again. A file system without working
locks (some NFS mounts) refuses nothing; docs/fault-tolerance.md says what that means.
"""

import contextlib
import errno
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from trainfleet.messages import report

LOCK_FILE = "run.lock"
BUSY_ERRNOS = (errno.EAGAIN, errno.EACCES)  # flock's "held by another": EWOULDBLOCK is EAGAIN on Linux


class RunFolderHeld(ValueError):
    """The run folder is held by another live process; the command is refused with exit 2."""


@dataclass
class Holder:
    """Who holds a run folder, as its lock file says."""

    host: str = "?"
    pid: str = "?"
    since: float | None = None  # the epoch second it took the lock

    @classmethod
    def parse(cls, text: str) -> "Holder | None":
        """The holder written in TEXT (``host pid since``), or None for an empty or foreign file."""
        parts = text.split()
        if len(parts) != 3:
            return None
        with contextlib.suppress(ValueError):
            return cls(parts[0], parts[1], float(parts[2]))
        return None

    def line(self) -> str:
        return f"{self.host} {self.pid} {self.since}\n"

    def describe(self) -> str:
        """``host h, pid 42, since 2025-01-02 10:11:12 (37 s ago)``."""
        if self.since is None:
            return f"host {self.host}, pid {self.pid}"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"host {self.host}, pid {self.pid}, since {when} ({time.time() - self.since:.0f} s ago)"


@dataclass
class Lock:
    folder: Path
    fd: int
    pid: int  # the process that took it: only it releases it


_held: Lock | None = None


def hold(folder: Path) -> None:
    """Makes this process the one writer of run FOLDER (created if missing) until it ends or calls ``release``.
    Raises ``RunFolderHeld`` naming the live holder. A process holds one run folder: holding another releases it."""
    global _held
    folder = Path(folder)
    if _held is not None and _held.pid == os.getpid():
        if _held.folder.resolve() == folder.resolve():
            return
        release()
    folder.mkdir(parents=True, exist_ok=True)
    fd = _locked_fd(folder / LOCK_FILE)
    if fd is None:
        return
    with os.fdopen(os.dup(fd), "r+") as file:
        stale = Holder.parse(file.read())
        file.seek(0)
        file.truncate()
        file.write(Holder(socket.gethostname(), str(os.getpid()), time.time()).line())
    if stale is not None:
        report(f"run folder {folder}: its previous holder ({stale.describe()}) ended without releasing it; taken over")
    _held = Lock(folder, fd, os.getpid())


def _locked_fd(path: Path) -> int | None:
    """An open descriptor of PATH holding its exclusive lock; None (said in one line) where locks do not work."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            text = _read(fd)
            os.close(fd)
            if error.errno in BUSY_ERRNOS:
                holder = Holder.parse(text) or Holder()
                raise RunFolderHeld(
                    f"run folder {path.parent} is being trained in by another process ({holder.describe()}):"
                    " two fits in one run folder would write over each other's checkpoints; wait for it to end or"
                    " stop it, or start a new run (without --ckpt_path)"
                ) from None
            _say_unlocked(path, error, Holder.parse(text))
            return None
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its holder released it (and removed the file) between our open and our lock: again


def _say_unlocked(path: Path, error: OSError, holder: Holder | None) -> None:
    """One line: the run goes on unguarded, and who the file names, if anyone (maybe a live fit elsewhere)."""
    named = f"; {LOCK_FILE} names {holder.describe()}" if holder else ""
    report(
        f"run folder {path.parent}: its file system does not lock files ({error.strerror}), so a second fit on it"
        f" would not be refused{named}"
    )


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.pread(fd, 4096, 0).decode(errors="replace")
    return ""


def release() -> None:
    """Ends this process's hold, its file removed (while still locked, so no other process locks a removed file)."""
    global _held
    if _held is None or _held.pid != os.getpid():
        return
    lock, _held = _held, None
    with contextlib.suppress(OSError):
        (lock.folder / LOCK_FILE).unlink()
    os.close(lock.fd)


def holds(folder: Path) -> bool:
    """Whether this process holds run FOLDER."""
    return _held is not None and _held.pid == os.getpid() and _held.folder.resolve() == Path(folder).resolve()


def owns_runs() -> bool:
    """Whether this process is the run's global rank 0, the one that takes the lock: Lightning's rank from the
    environment (RANK, LOCAL_RANK, SLURM_PROCID), on the first node (NODE_RANK or torchrun's GROUP_RANK), where a
    multi-node launch without RANK starts a local rank 0 on every node."""
    node = os.environ.get("NODE_RANK") or os.environ.get("GROUP_RANK") or "0"
    return rank_zero_only.rank == 0 and node == "0"


def _forget_in_child() -> None:
    """A forked process (a local rank, a DataLoader worker) closes its copy of the lock: only its holder keeps it, so
    it is free once the holder has ended. Closing a copy leaves the holder's lock as it is (flock's are per open file,
    released only when its last descriptor is closed or by an unlock, never called here)."""
    global _held
    if _held is not None:
        with contextlib.suppress(OSError):
            os.close(_held.fd)
        _held = None


os.register_at_fork(after_in_child=_forget_in_child)
