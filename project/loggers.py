"""Loggers: Lightning's, with one fix so a resumed run keeps its history."""

import csv

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class CSVLogger(loggers.CSVLogger):
    """Lightning's ``CSVLogger``, except that a resumed run appends to its ``metrics.csv``.

    Lightning's deletes the file when its folder already exists, which would lose everything a resumed run
    (``fit --ckpt_path last`` logs into its own version folder again) logged before the interruption.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment


class AppendingExperimentWriter(ExperimentWriter):
    """Keeps an existing ``metrics.csv``: its columns are taken as known, new rows are appended below its rows."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = list(csv.DictReader(file).fieldnames or [])
