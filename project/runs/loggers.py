"""Loggers: Lightning's, with two fixes: a resumed run keeps its history; runs that start together get their own
folders."""

from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from project import lightning_internals as internals
from project.runs.folders import claim_run_folder, next_run_number


class CSVLogger(loggers.CSVLogger):
    """Lightning's ``CSVLogger``, except that a resumed run appends to its ``metrics.csv``, and that a new run claims
    its folder on rank 0 (``claim_run_folder``), so fits that start at the same moment never share one.

    Lightning's deletes the file when its folder already exists, which would lose everything a resumed run
    (``fit --ckpt_path last`` logs into its own version folder again) logged before the interruption.
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
