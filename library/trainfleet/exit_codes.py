"""Every exit code a run ends with, and what its launcher should do about it. Light on purpose (no torch, no
Lightning): the Ctrl-C watch (``runtime/early_interrupt.py``) uses it before anything heavy is imported.

- 0: the run finished;
- ``CRASHED`` (1): anything else (a crashed or killed rank, a hang past the process-group timeout, a lost node); the
  launchers restart the run, which resumes (``runs/restarts.py``);
- ``REFUSED`` (2): bad input (a config, a missing checkpoint), before anything starts; a restart would be refused again;
- ``DETERMINISTIC`` (3): the NaN guard; the same weights and data would fail at the same step again;
- ``DISK_FULL`` (4): a checkpoint or log that could not be written for want of space; a restart would fill it again;
- ``INTERRUPTED`` (130): Ctrl-C; final;
- ``PREEMPTED`` (143): preemption or the time limit, after saving; the scheduler requeues or not.
"""

import errno
import signal

CRASHED_EXIT_CODE = 1
REFUSED_EXIT_CODE = 2  # argparse's and jsonargparse's code for a refused command line
DETERMINISTIC_EXIT_CODE = 3
DISK_FULL_EXIT_CODE = 4
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left, quota exceeded
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # 130: what shells report for a command Ctrl-C ended
# 128 + SIGTERM, what shells, SLURM and Kubernetes report for a process that SIGTERM ended: schedulers and scripts
# read "terminated before the end" (requeue, or resume with --ckpt_path last), not success (0) nor a crash (1).
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# The codes no launcher restarts from: the run would end the same way again, or was meant to stop.
FINAL_EXIT_CODES = (
    REFUSED_EXIT_CODE,
    DETERMINISTIC_EXIT_CODE,
    DISK_FULL_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
)


def exit_code_for(error: BaseException) -> int:
    """The exit code a rank that raised ERROR ends with: the NaN guard's failures are deterministic."""
    if isinstance(error, FloatingPointError):
        return DETERMINISTIC_EXIT_CODE
    return DISK_FULL_EXIT_CODE if is_disk_full(error) else CRASHED_EXIT_CODE


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ERROR, or an error it was raised from or while handling, is a full disk: torch's writer reports one as
    ``RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos``, raised while handling the
    ``OSError``."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
