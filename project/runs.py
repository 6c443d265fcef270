"""Run folders: every ``fit`` is a new run beside the earlier ones; ``last``/``best``/``auto`` name a run's checkpoint.

The layout is Lightning's own: the first logger numbers its folders ``<default_root_dir>/lightning_logs/version_N/``
and, with no ``dirpath`` set, ``ModelCheckpoint`` writes into that folder's ``checkpoints/``; ``config.yaml`` and
``metrics.csv`` sit beside it. Lightning's own ``ckpt_path="last"`` would look only in the new run's empty folder and
silently start fresh, and its ``"best"`` exists only in the process that trained, so the CLI resolves them here,
before anything is built. A resumed run logs into its own folder again, and into its own tracker runs (MLflow, W&B),
whose ids the run records in ``trackers.json``.
"""

import json
import os
import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback

from project.checkpointing import load_checkpoint_file

RUN_FOLDER = re.compile(r"version_(\d+)")
TRACKERS_FILE = "trackers.json"
# The constructor argument that names an existing run, per logger: MLflow's run_id, the others' version.
RUN_ID_ARGS = ("run_id", "version")


def logger_configs(trainer: Namespace) -> list[Namespace]:
    logger = trainer.get("logger")
    loggers = logger if isinstance(logger, list) else [logger]
    return [item for item in loggers if isinstance(item, Namespace) and item.get("init_args") is not None]


def default_save_dirs(trainer: Namespace) -> None:
    """Loggers write under ``default_root_dir`` unless their config names another folder (a list of loggers too)."""
    for logger in logger_configs(trainer):
        if "save_dir" in logger.init_args and logger.init_args.save_dir is None:
            logger.init_args.save_dir = trainer.get("default_root_dir") or "."


def versions_folder(trainer: Namespace) -> Path | None:
    """``save_dir/name``, where the first logger numbers its runs; None when it numbers none."""
    loggers = logger_configs(trainer)
    if not loggers or "version" not in loggers[0].init_args or "name" not in loggers[0].init_args:
        return None
    init_args = loggers[0].init_args
    return Path(init_args.get("save_dir") or trainer.get("default_root_dir") or ".") / (init_args.name or "")


def fixed_checkpoint_folder(config: Namespace) -> Path | None:
    """The one checkpoint folder every run shares: an explicit ``checkpoint.dirpath``, or, without a versioning
    logger, Lightning's ``<default_root_dir>/checkpoints``. None when each run has its own."""
    if config.checkpoint.get("dirpath"):
        return Path(config.checkpoint.dirpath)
    if versions_folder(config.trainer) is None:
        return Path(config.trainer.get("default_root_dir") or ".") / "checkpoints"
    return None


def run_folders(config: Namespace) -> list[Path]:
    """Every run's folder, newest (highest version) first."""
    numbered = [
        (int(match.group(1)), path)
        for path in versions_folder(config.trainer).glob("version_*")
        if (match := RUN_FOLDER.fullmatch(path.name)) and path.is_dir()
    ]
    return [path for _, path in sorted(numbered, reverse=True)]


def find_checkpoint(config: Namespace, which: str) -> tuple[Path, Path | None] | None:
    """(the ``last`` or ``best`` checkpoint of the newest run that has a ``last.ckpt``, that run's folder)."""
    fixed = fixed_checkpoint_folder(config)
    candidates = [(fixed, None)] if fixed else [(folder / "checkpoints", folder) for folder in run_folders(config)]
    for checkpoints, folder in candidates:
        if (checkpoints / "last.ckpt").is_file():
            last = checkpoints / "last.ckpt"
            return (last if which == "last" else best_checkpoint(last)), folder
    return None


def best_checkpoint(last: Path) -> Path:
    """The best checkpoint ModelCheckpoint recorded in LAST (its state travels in every checkpoint it writes)."""
    states = load_checkpoint_file(last, mmap=True).get("callbacks", {})
    best = [state["best_model_path"] for key, state in states.items() if key.startswith("ModelCheckpoint")]
    if not best or not best[0]:
        raise ValueError(f"--ckpt_path best: {last} records no best checkpoint (is checkpoint.monitor set?)")
    return last.parent / Path(best[0]).name  # the same file, wherever the run folder has moved since


def continue_run(config: Namespace, folder: Path) -> str:
    """Points the loggers at run FOLDER's own runs, so a resumed fit logs where it did before; returns a free name
    for this attempt's config file (the run's first ``config.yaml`` is kept as it was)."""
    loggers = logger_configs(config.trainer)
    loggers[0].init_args.version = int(RUN_FOLDER.fullmatch(folder.name).group(1))
    trackers = json.loads((folder / TRACKERS_FILE).read_text()) if (folder / TRACKERS_FILE).is_file() else {}
    for index, logger in enumerate(loggers[1:], start=1):
        run_id = trackers.get(str(index), {}).get("run_id")
        arg = next((name for name in RUN_ID_ARGS if name in logger.init_args), None)
        if run_id and arg and logger.class_path.rsplit(".", 1)[-1] == trackers[str(index)]["logger"]:
            logger.init_args[arg] = run_id
    earlier = list(folder.glob("config*.yaml"))
    return f"config.resume-{len(earlier)}.yaml" if earlier else "config.yaml"


def restart_count() -> int:
    """How often torchrun (``--max-restarts``) has restarted this job's processes."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class RunRecord(SaveConfigCallback):
    """Lightning's config saving, plus: the resolved config as the trackers' parameters (on a run's first attempt;
    trackers refuse to change a parameter), and each tracker's run id in ``trackers.json`` so a resume continues it."""

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not trainer.loggers:
            return
        if self.config_filename == "config.yaml":  # a first attempt
            params = flatten(self.parser.dump(self.config, skip_none=False, format="json"))
            for logger in trainer.loggers[1:]:
                logger.log_hyperparams(params)
        trackers = {  # tracker run ids are strings; a numbered logger's version is not a tracker's
            str(index): {"logger": type(logger).__name__, "run_id": run_id}
            for index, logger in enumerate(trainer.loggers)
            if index > 0 and isinstance(run_id := getattr(logger, "run_id", None) or logger.version, str)
        }
        # loggers[0].log_dir, not trainer.log_dir: that one broadcasts, and only rank 0 is here. A first logger
        # without a run folder (no log_dir) has no resume to serve.
        run_folder = getattr(trainer.loggers[0], "log_dir", None)
        if trackers and run_folder:
            (Path(run_folder) / TRACKERS_FILE).write_text(json.dumps(trackers, indent=2) + "\n")


def flatten(config_json: str) -> dict[str, Any]:
    """``{"trainer.max_epochs": 20, ...}``: nested config keys joined with dots, the way the CLI spells them."""
    flat: dict[str, Any] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(item, f"{prefix}.{key}" if prefix else key)
        else:
            flat[prefix] = value

    walk(json.loads(config_json), "")
    return flat
