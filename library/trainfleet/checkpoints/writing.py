"""Whether a checkpoint is being written, in memory shared across ``fork``: a warm-restart supervisor
(runtime/warm_restart.py) lets the rank it forked finish a save before it ends it, instead of cutting the write.

The counter lives in an anonymous shared mapping made when this module is imported, which the supervisor does before
it forks: every rank it forks writes where the supervisor reads. Elsewhere it is this process's own counter.
"""

import contextlib
import mmap
import struct
import threading
from collections.abc import Iterator
from concurrent.futures import Future

_COUNTER = mmap.mmap(-1, struct.calcsize("q"))  # anonymous mappings are shared with forked children (MAP_SHARED)
_LOCK = threading.Lock()  # a rank's writer thread and its main thread both count


def _add(delta: int) -> None:
    with _LOCK:
        _COUNTER[:] = struct.pack("q", struct.unpack("q", _COUNTER)[0] + delta)


@contextlib.contextmanager
def writing() -> Iterator[None]:
    """Marks a checkpoint write for as long as the block runs."""
    _add(1)
    try:
        yield
    finally:
        _add(-1)


def until_done(future: Future) -> Future:
    """Marks FUTURE's background write until it completes; returns it."""
    _add(1)
    future.add_done_callback(lambda _: _add(-1))
    return future


def in_progress() -> bool:
    """Whether this process, or the rank forked from it, is writing a checkpoint now."""
    return struct.unpack("q", _COUNTER)[0] > 0


def reset() -> None:
    """Before a fork: a rank killed mid-write left its count behind."""
    _COUNTER[:] = struct.pack("q", 0)
