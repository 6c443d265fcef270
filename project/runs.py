"""Run folders: every ``fit`` is a new run beside the earlier ones, and ``last`` means the newest run's ``last.ckpt``.

The layout is Lightning's own: the logger numbers its folders ``<default_root_dir>/lightning_logs/version_N/`` and,
with no ``dirpath`` set, ``ModelCheckpoint`` writes into that folder's ``checkpoints/``; ``config.yaml`` and
``metrics.csv`` sit beside it. Lightning's own ``ckpt_path="last"`` would look only in the new run's empty folder and
silently start fresh, so the CLI resolves ``last`` here, before anything is built.
"""

import re
from pathlib import Path

from jsonargparse import Namespace

VERSION_FOLDER = re.compile(r"version_(\d+)")


def first_logger(trainer: Namespace) -> Namespace | None:
    """The config of the logger whose folder holds the checkpoints (Lightning uses the first one)."""
    logger = trainer.get("logger")
    if isinstance(logger, list):
        logger = logger[0] if logger else None
    return logger if isinstance(logger, Namespace) else None


def versions_folder(trainer: Namespace) -> Path | None:
    """``save_dir/name``, where the logger numbers its runs; None when there is no versioning logger."""
    logger = first_logger(trainer)
    init_args = logger.get("init_args") if logger is not None else None
    if init_args is None or "version" not in init_args:
        return None
    save_dir = init_args.get("save_dir") or trainer.get("default_root_dir") or "."
    return Path(save_dir) / (init_args.get("name") or "")


def fixed_checkpoint_folder(config: Namespace) -> Path | None:
    """The one checkpoint folder every run shares: an explicit ``checkpoint.dirpath``, or, without a versioning
    logger, Lightning's ``<default_root_dir>/checkpoints``. None when each run has its own."""
    if config.checkpoint.get("dirpath"):
        return Path(config.checkpoint.dirpath)
    if versions_folder(config.trainer) is None:
        return Path(config.trainer.get("default_root_dir") or ".") / "checkpoints"
    return None


def newest_run(config: Namespace) -> tuple[Path, int | None] | None:
    """(``last.ckpt`` of the newest run that has one, its version number), or None if there is none."""
    fixed = fixed_checkpoint_folder(config)
    if fixed is not None:
        return (fixed / "last.ckpt", None) if (fixed / "last.ckpt").is_file() else None
    runs = [
        (int(match.group(1)), path)
        for path in versions_folder(config.trainer).glob("version_*")
        if (match := VERSION_FOLDER.fullmatch(path.name))
    ]
    for version, path in sorted(runs, reverse=True):
        if (path / "checkpoints" / "last.ckpt").is_file():
            return path / "checkpoints" / "last.ckpt", version
    return None


def continue_run(config: Namespace, version: int) -> str:
    """Points the logger at run VERSION, so a resumed fit logs into its own folder; returns a free name for this
    attempt's config file (the run's first ``config.yaml`` is kept as it was)."""
    logger = first_logger(config.trainer)
    logger.init_args.version = version
    earlier = list((versions_folder(config.trainer) / f"version_{version}").glob("config*.yaml"))
    return f"config.resume-{len(earlier)}.yaml" if earlier else "config.yaml"
