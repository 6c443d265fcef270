"""What a run leaves in its folder: run folders, logged metrics, checkpoints and their weights."""

import csv
from pathlib import Path

import torch


def run_folder(root: Path, version: int | None = None) -> Path:
    """The folder of one run under ROOT (``trainer.default_root_dir``), the newest when VERSION is None:
    ``lightning_logs/version_N`` with the run's ``checkpoints/``, ``config.yaml`` and ``metrics.csv``."""
    if version is not None:
        return root / "lightning_logs" / f"version_{version}"
    versions = sorted(root.glob("lightning_logs/version_*"), key=lambda path: int(path.name.split("_")[1]))
    assert versions, f"no run in {root}"
    return versions[-1]


def metrics_rows(folder: Path) -> list[dict[str, str]]:
    """The rows of the metrics.csv in run FOLDER (``run_folder``), as ``csv.DictReader`` reads them ("" when unset)."""
    with (folder / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def saved_step(run_dir: Path) -> int:
    """The step of the run's newest last.ckpt (0 before the first)."""
    last = run_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        return torch.load(last, map_location="cpu", weights_only=True, mmap=True)["global_step"]
    except (FileNotFoundError, RuntimeError, EOFError):  # not written yet, or replaced as it was read
        return 0


def metric_values(folder: Path, name: str) -> list[float]:
    """NAME's values in the metrics.csv of run FOLDER, in logged order (the rows that hold it)."""
    return [float(row[name]) for row in metrics_rows(folder) if row.get(name)]


def logged_metrics(root: Path) -> list[tuple[str, int]]:
    """Each (metric, step) that the newest run under ROOT logged in its metrics.csv, in file order: a run resumed
    after an interruption holds each step once, as the uninterrupted run does."""
    rows = metrics_rows(run_folder(root))
    return [(key, int(row["step"])) for row in rows for key, value in row.items() if value and key not in NOT_METRICS]


NOT_METRICS = ("step", "epoch")


def checkpoint_dir(root: Path, version: int | None = None) -> Path:
    """Where a run's checkpoints are: the newest run that has any, when VERSION is None."""
    if version is not None:
        return run_folder(root, version) / "checkpoints"
    [*_, newest] = sorted(root.glob("lightning_logs/version_*/checkpoints"), key=lambda p: int(p.parent.name[8:]))
    return newest


def last_checkpoint(root: Path, version: int | None = None) -> Path:
    return checkpoint_dir(root, version) / "last.ckpt"


def last_weights(root: Path) -> dict[str, torch.Tensor]:
    """The state dict of the newest run's ``last.ckpt`` under ROOT."""
    return torch.load(last_checkpoint(root), map_location="cpu", weights_only=True)["state_dict"]
