"""Loggers: Lightning's, with fixes: a resumed run keeps its history, without the rows logged after its
checkpoint; runs that start together get their own folders."""

from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import Trainer, loggers
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from trainfleet import lightning_internals as internals
from trainfleet.runs.folders import claim_run_folder, next_run_number


class CSVLogger(loggers.CSVLogger):
    """Lightning's ``CSVLogger``, except that a resumed run appends to its ``metrics.csv``, and that a new run claims
    its folder on rank 0 (``claim_run_folder``), so fits that start at the same moment never share one.

    Lightning's deletes the file when its folder already exists, which would lose everything a resumed run
    (``fit --ckpt_path last`` logs into its own version folder again) logged before the interruption. Rows logged
    after the checkpoint are logged again by the resumed run: each checkpoint records how many rows were logged before
    it (``record_rows``), and the resume drops the rest (``drop_rows_after``), so each step is in the file once.
    """

    def __init__(
        self,
        save_dir: str | Path,
        name: str = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(save_dir, name, version, prefix, flush_logs_every_n_steps)
        self.run_version = version

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        return internals.appending_csv_experiment(self)

    @property
    def version(self) -> int | str:
        """The run's number: the configured ``version``, or a new run's, which rank 0 claims as a folder (the other
        ranks only read the number)."""
        if self.run_version is None:
            root = Path(self.root_dir)
            self.run_version = claim_run_folder(root) if rank_zero_only.rank == 0 else next_run_number(root)
        return self.run_version

    @rank_zero_only
    def save(self) -> None:
        """Lightning's, except into a run folder that is gone: a failed run's, with nothing to keep (RunRecord)."""
        if Path(self.log_dir).is_dir():
            super().save()


METRICS_ROWS_KEY = "metrics_csv_rows"  # in a checkpoint: the rows of metrics.csv logged before it


def _csv_logger(trainer: Trainer) -> CSVLogger | None:
    return next((logger for logger in trainer.loggers if isinstance(logger, CSVLogger)), None)


def record_rows(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """On saving CHECKPOINT (rank 0 writes it): the rows logged so far, flushed to the file first, so that a process
    killed after the checkpoint never loses the rows logged before it."""
    logger = _csv_logger(trainer)
    if logger is not None and trainer.is_global_zero:
        logger.save()
        checkpoint[METRICS_ROWS_KEY] = logger.experiment.rows_logged


def drop_rows_after(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    """On resuming from CHECKPOINT: the rows the interrupted attempt logged after it, for its step or later, are
    dropped; the resumed run logs them again. (The epoch-end rows of the checkpoint's own epoch, logged for the step
    before it once it was saved, stay: a resumed run does not log them again.)"""
    logger, rows = _csv_logger(trainer), checkpoint.get(METRICS_ROWS_KEY)
    if logger is not None and rows is not None and trainer.is_global_zero:
        logger.experiment.drop_rows(after=rows, from_step=checkpoint["global_step"])
