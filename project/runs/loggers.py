"""Loggers: Lightning's, with one fix so a resumed run keeps its history."""

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

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
