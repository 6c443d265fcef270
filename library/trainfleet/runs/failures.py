"""A crash after training started fits on one screen: the whole traceback goes to a file in the run folder.

``FailFast`` (runtime/faults.py) says in one ``[project]`` line which rank failed, at which step and why; the
interpreter then printed the whole traceback after it, 90 lines when a peer node was killed (Lightning's loops,
DDP, the collective), once per rank. Once training has started, a rank's traceback goes to
``<run folder>/failure-rank<N>.txt`` instead (appended: a warm restart's next failure goes below), and the screen
gets one line with its path and the traceback's last lines. Before training starts (a config's object that fails to
build, the data module's own errors) the traceback is printed whole, as before: it is short and it is the message.
"""

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import TracebackType

from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet.messages import report, write_line
from trainfleet.runs.folders import holds_nothing_to_keep

EXCERPT_LINES = 5  # the last frame (where, and its line of code) and the error, for most tracebacks

_where: Path | None = None  # this rank's failure file, once training has started
_rank: int = 0


class FailureFile(Callback):
    """Names, once training starts, the file each rank's traceback goes to if it crashes (``report_crash``)."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        global _where, _rank
        folder = trainer.log_dir or trainer.default_root_dir  # log_dir broadcasts rank 0's: every rank calls it
        _where, _rank = Path(folder) / f"failure-rank{trainer.global_rank}.txt", trainer.global_rank


def report_crash(
    error_type: type[BaseException], error: BaseException, tb: TracebackType | None, where: Path | None = None
) -> None:
    """What a crash prints as it ends its process: the traceback whole before training started, else its file's
    path and last lines (the file: WHERE, else the run's ``failure-rank<N>.txt``, else a temporary file)."""
    where = where or _where
    if where is None:
        sys.excepthook(error_type, error, tb)
        return
    lines = "".join(traceback.format_exception(error_type, error, tb)).rstrip("\n").splitlines()
    path = _write(where, lines)
    shown = lines[-EXCERPT_LINES:]
    report(f"rank {_rank}: its traceback ({len(lines)} lines) is in {path}; its last {len(shown)} lines:")
    write_line("\n".join(shown), sys.stderr)


def _write(where: Path, lines: list[str]) -> Path:
    """Appends LINES, after a header, to WHERE; to a temporary file where the run folder has nothing to keep (a new
    run's that failed before its first checkpoint or metric: RunRecord removes it, maybe while this rank writes), is
    gone, or cannot be written (a node without the run's file system)."""
    text = f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()} ---\n" + "\n".join(lines) + "\n"
    if where.parent.is_dir() and not holds_nothing_to_keep(where.parent):
        try:
            with open(where, "a") as file:
                file.write(text)
            return where
        except OSError:
            pass
    handle, name = tempfile.mkstemp(prefix=f"{where.stem}-", suffix=".txt")
    with os.fdopen(handle, "w") as file:
        file.write(text)
    return Path(name)
