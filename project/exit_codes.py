"""Every exit code a run ends with, and what its launcher should do about it. Light on purpose (no torch, no
Lightning): the Ctrl-C watch (``runtime/early_interrupt.py``) uses it before anything heavy is imported.

- 0: the run finished;
- ``CRASHED`` (1): anything else (a crashed or killed rank, a hang past the process-group timeout, a lost node); the
  launchers restart the run, which resumes (``runs/restarts.py``);
- ``REFUSED`` (2): bad input (a config, a missing checkpoint), before anything starts; a restart would be refused again;
- ``DETERMINISTIC`` (3): the NaN guard; the same weights and data would fail at the same step again;
- ``INTERRUPTED`` (130): Ctrl-C; final;
- ``PREEMPTED`` (143): preemption or the time limit, after saving; the scheduler requeues or not.
"""

import signal

CRASHED_EXIT_CODE = 1
REFUSED_EXIT_CODE = 2  # argparse's and jsonargparse's code for a refused command line
DETERMINISTIC_EXIT_CODE = 3
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT  # 130: what shells report for a command Ctrl-C ended
# 128 + SIGTERM, what shells, SLURM and Kubernetes report for a process that SIGTERM ended: schedulers and scripts
# read "terminated before the end" (requeue, or resume with --ckpt_path last), not success (0) nor a crash (1).
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
# The codes no launcher restarts from: the run would end the same way again, or was meant to stop.
FINAL_EXIT_CODES = (REFUSED_EXIT_CODE, DETERMINISTIC_EXIT_CODE, INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE)


def exit_code_for(error: BaseException) -> int:
    """The exit code a rank that raised ERROR ends with: the NaN guard's failures are deterministic."""
    return DETERMINISTIC_EXIT_CODE if isinstance(error, FloatingPointError) else CRASHED_EXIT_CODE
