"""SLURM's requeue signal (SIGUSR1), caught from the command's first line.

SLURM sends it before the time limit (``#SBATCH --signal=SIGUSR1@120``), up to a minute earlier than asked, so it can
come while a task is still importing torch or building the model; SIGUSR1's default action ends the process. Caught
from the start, it counts for the run's first preemption check (``preemption.py``). Lightning then registers no
handler of its own (one is there), so this one passes the signal on to the run's ``PreemptionCheck``. Kept free of
heavy imports: ``trainfleet/main.py`` installs it before importing torch.
"""

import os
import signal
from types import FrameType
from typing import Any


class EarlyRequeueSignal:
    received = False
    check: Any = None  # the run's PreemptionCheck, once it is installed

    @classmethod
    def catch(cls) -> None:
        """In a SLURM job's task (SLURM_JOB_ID and SLURM_NTASKS set, as SLURMEnvironment detects it)."""
        in_job = "SLURM_JOB_ID" in os.environ and "SLURM_NTASKS" in os.environ
        if in_job and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
            signal.signal(signal.SIGUSR1, cls.handle)

    @classmethod
    def handle(cls, signum: int, frame: FrameType | None) -> None:
        if cls.check is None:
            cls.received = True
        else:
            cls.check._on_requeue(signum, frame)
