"""Which faults a run restarts from by itself, and which end it for good (the codes: ``trainfleet/exit_codes.py``):
the outcome each rank leaves for its launcher, and each restart's record in the run folder.

A crashed or killed rank, a rank that hung past the process-group timeout, a lost node (exit 1): the launcher restarts
the run, which resumes from its run folder's newest checkpoint, up to a restart budget (``MAX_RESTARTS`` in
``scripts/slurm.sbatch`` and ``scripts/torchrun.sh``). The final codes (``FINAL_EXIT_CODES``) end it for good.

srun reports one exit code for all tasks, and when one task fails it ends the others with SIGTERM, so the code says
nothing about the cause: each rank appends its outcome (``CODE<TAB>CAUSE``) to ``PROJECT_EXIT_FILE``, which
``scripts/slurm.sbatch`` reads after each srun step.
"""

import os
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from trainfleet.exit_codes import DISK_FULL_EXIT_CODE, FINAL_EXIT_CODES, INTERRUPTED_EXIT_CODE, REFUSED_EXIT_CODE
from trainfleet.messages import first_line, report

EXIT_FILE_VAR = "PROJECT_EXIT_FILE"
RESTART_COUNT_VAR = "PROJECT_RESTART_COUNT"  # restarts within a SLURM allocation (scripts/slurm.sbatch)
RESTART_CAUSE_VAR = "PROJECT_RESTART_CAUSE"
# When a warm restart's failure began and when rank 0's supervisor knew it (time.time()): the goodput record's
# detection and recovery seconds (runs/goodput.py).
FAILED_AT_VAR = "PROJECT_FAILED_AT"
KNOWN_AT_VAR = "PROJECT_FAILURE_KNOWN_AT"
WARM_GENERATION_VAR = "PROJECT_WARM_GENERATION"  # warm restarts of the launched processes (runtime/warm_restart.py)
RESTARTS_FILE = "restarts.txt"  # in the run folder: one line per restart, with its cause


def record_outcome(code: int | str, cause: str) -> None:
    """Appends this rank's outcome to ``PROJECT_EXIT_FILE`` when the launcher asked for it (one short line: appends
    from several ranks do not interleave); a warm restart's is ``restart`` (runtime/warm_restart.py)."""
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
    """Restarts within a SLURM allocation: new srun steps, and warm restarts within each."""
    return int(os.environ.get(RESTART_COUNT_VAR) or 0) + warm_generation()


def warm_generation() -> int:
    """How often this process's supervisor has restarted its rank (runtime/warm_restart.py)."""
    return int(os.environ.get(WARM_GENERATION_VAR) or 0)


@rank_zero_only
def record_restart(folder: Path, what: str, cause: str | None = None) -> tuple[str, str]:
    """Counts a restart in run FOLDER (``restarts.txt``, one line each) and says it, with its CAUSE (by default what
    the launcher or the failed rank said). Returns (WHAT, the cause), for the goodput record (None on other ranks)."""
    cause = cause or os.environ.get(RESTART_CAUSE_VAR) or last_outcome() or "a rank ended without a word (killed?)"
    with open(folder / RESTARTS_FILE, "a") as file:
        file.write(f"{what}: {cause}\n")
    count = len((folder / RESTARTS_FILE).read_text().splitlines())
    report(f"{what} (cause: {cause}); restart {count} of this run, counted in {folder / RESTARTS_FILE}")
    return what, cause


def last_outcome() -> str | None:
    """The cause the last rank to fail recorded in ``PROJECT_EXIT_FILE`` (torchrun's attempts share it)."""
    path = Path(os.environ.get(EXIT_FILE_VAR) or "/nonexistent")
    lines = path.read_text().splitlines() if path.is_file() else []
    return lines[-1].partition("\t")[2] if lines else None
