"""Loggers: Lightning's, with two fixes: a resumed run keeps its history; runs that start together get their own
folders."""

from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from project.runs.folders import claim_run_folder
from project.runtime import lightning_internals as internals


class CSVLogger(loggers.CSVLogger):
    """Lightning's ``CSVLogger``, except that a resumed run appends to its ``metrics.csv``.

    Lightning's deletes the file when its folder already exists, which would lose everything a resumed run
    (``fit --ckpt_path last`` logs into its own version folder again) logged before the interruption.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        return internals.appending_csv_experiment(self)

    @property
    def version(self) -> int | str:
        """The run's number: on rank 0 a new run claims its folder (``claim_run_folder``), so fits that start at
        the same moment never share one."""
        return internals.logger_version(self, claim_run_folder)

    @rank_zero_only
    def save(self) -> None:
        """Lightning's, except into a run folder that is gone: a failed run's, with nothing to keep (RunRecord)."""
        if Path(self.log_dir).is_dir():
            super().save()
