"""Which faults a run restarts from by itself, and which end it for good: the exit codes, the outcome each rank leaves
for its launcher, and each restart's record in the run folder.

- a refusal (bad config, a missing checkpoint): exit 2, before anything starts; a restart would be refused again;
- a deterministic failure (the NaN guard): exit 3; the same weights and data would fail at the same step again;
- the disk full (a checkpoint or log that could not be written): exit 4; a restart would fill it again, at once;
- preemption and the time limit: exit 143 after saving (``runtime/preemption.py``); the scheduler requeues or not;
- anything else (a crashed or killed rank, a rank that hung past the process-group timeout, a lost node): the
  launcher restarts the run, which resumes from its run folder's newest checkpoint, up to a restart budget
  (``MAX_RESTARTS`` in ``scripts/slurm.sbatch`` and ``scripts/torchrun.sh``).

srun reports one exit code for all tasks, and when one task fails it ends the others with SIGTERM, so the code says
nothing about the cause: each rank appends its outcome (``CODE<TAB>CAUSE``) to ``PROJECT_EXIT_FILE``, which
``scripts/slurm.sbatch`` reads after each srun step.
"""

import errno
import os
import signal
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from project.messages import first_line, report

REFUSED_EXIT_CODE = 2  # argparse's and jsonargparse's code for a refused command line
DETERMINISTIC_EXIT_CODE = 3
DISK_FULL_EXIT_CODE = 4
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left, quota exceeded
# 128 + SIGTERM, what shells, SLURM and Kubernetes report for a process that SIGTERM ended: schedulers and scripts
# read "terminated before the end" (requeue, or resume with --ckpt_path last), not success (0) nor a crash (1).
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # 130: what shells report for a command Ctrl-C ended
FINAL_EXIT_CODES = (
    REFUSED_EXIT_CODE,
    DETERMINISTIC_EXIT_CODE,
    DISK_FULL_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
)
CRASHED_EXIT_CODE = 1
EXIT_FILE_VAR = "PROJECT_EXIT_FILE"
RESTART_COUNT_VAR = "PROJECT_RESTART_COUNT"  # restarts within a SLURM allocation (scripts/slurm.sbatch)
RESTART_CAUSE_VAR = "PROJECT_RESTART_CAUSE"
RESTARTS_FILE = "restarts.txt"  # in the run folder: one line per restart, with its cause


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


def record_outcome(code: int, cause: str) -> None:
    """Appends this rank's outcome to ``PROJECT_EXIT_FILE`` when the launcher asked for it (one short line: appends
    from several ranks do not interleave)."""
    path = os.environ.get(EXIT_FILE_VAR)
    if not path:
        return
    try:
        with open(path, "a") as file:
            file.write(f"{code}\t{cause.replace(chr(10), ' ')}\n")
    except OSError as error:
        report(f"could not record the outcome in {path}: {first_line(error)}")


def record_exit(error: SystemExit) -> None:
    """A rank that ends with a final exit code (a refusal, or a stop after preemption) records it."""
    if error.code in FINAL_EXIT_CODES:
        what = {
            REFUSED_EXIT_CODE: "refused",
            INTERRUPTED_EXIT_CODE: "interrupted (Ctrl-C)",
            DISK_FULL_EXIT_CODE: "disk full",
        }
        record_outcome(int(error.code), what.get(error.code, "preempted, saved"))


def srun_restart_count() -> int:
    return int(os.environ.get(RESTART_COUNT_VAR) or 0)


@rank_zero_only
def record_restart(folder: Path, what: str, cause: str | None = None) -> None:
    """Counts a restart in run FOLDER (``restarts.txt``, one line each) and says it, with its CAUSE (by default what
    the launcher or the failed rank said)."""
    cause = cause or os.environ.get(RESTART_CAUSE_VAR) or last_outcome() or "a rank ended without a word (killed?)"
    with open(folder / RESTARTS_FILE, "a") as file:
        file.write(f"{what}: {cause}\n")
    count = len((folder / RESTARTS_FILE).read_text().splitlines())
    report(f"{what} (cause: {cause}); restart {count} of this run, counted in {folder / RESTARTS_FILE}")


def last_outcome() -> str | None:
    """The cause the last rank to fail recorded in ``PROJECT_EXIT_FILE`` (torchrun's attempts share it)."""
    path = Path(os.environ.get(EXIT_FILE_VAR) or "/nonexistent")
    lines = path.read_text().splitlines() if path.is_file() else []
    return lines[-1].partition("\t")[2] if lines else None
