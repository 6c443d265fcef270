"""Run folders: every ``fit`` is a new run beside the earlier ones; ``last``/``best``/``auto`` name a run's checkpoint.

The layout is Lightning's own: the first logger numbers its folders ``<default_root_dir>/lightning_logs/version_N/``
and, with no ``dirpath`` set, ``ModelCheckpoint`` writes into that folder's ``checkpoints/``; ``config.yaml`` and
``metrics.csv`` sit beside it. Lightning's own ``ckpt_path="last"`` would look only in the new run's empty folder and
silently start fresh, and its ``"best"`` exists only in the process that trained, so the CLI resolves them here,
before anything is built (``prepare_run``). A resumed run logs into its own folder again, and into its own tracker
runs (MLflow, W&B), whose ids the run records in ``trackers.json``.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_only

from trainfleet import program
from trainfleet.checkpoints.files import checkpoint_meta, recover_interrupted_save
from trainfleet.messages import report
from trainfleet.runs.goodput import GOODPUT_FILE
from trainfleet.runs.lock import LOCK_FILE, hold, owns_runs
from trainfleet.runs.restarts import record_restart, srun_restart_count, warm_generation

RUN_FOLDER = re.compile(r"version_(\d+)")
TRACKERS_FILE = "trackers.json"
JOB_FILE = "slurm_job.txt"  # the SLURM job that last trained in a run folder: a requeued job finds its run by it
# The constructor argument that names an existing run, per logger: MLflow's run_id, the others' version.
RUN_ID_ARGS = ("run_id", "version")
# What a run writes as it starts; a failed run's folder holding nothing else has nothing to keep (RunRecord).
START_FILES = ("config*.yaml", "hparams.yaml", TRACKERS_FILE, JOB_FILE, LOCK_FILE, "failure-rank*.txt", GOODPUT_FILE)
ANOTHER_EXPERIMENT = "is that run another experiment's? Give each its own trainer.default_root_dir"
# Names Trainer.fit/test/... resolve themselves instead of reading a file ("last", "best", "auto" are resolved here).
LIGHTNING_CKPT_ALIASES = ("hpc", "registry")


class RunFolderError(ValueError):
    """A ``--ckpt_path`` or run folder that cannot be used; the CLI prints it and exits 2."""


@dataclass
class RunPlan:
    """Where a subcommand's run goes: the file name for this attempt's config (``config.yaml`` on a run's first
    attempt), the run folder it continues (None: a new one, which the logger claims: ``claim_run_folder``), and the
    restart it is, if one."""

    config_filename: str = "config.yaml"
    folder: Path | None = None
    restart: tuple[str, str] | None = None  # the restart this attempt is, (what, cause) as restarts.txt counts it


def prepare_run(config: Namespace, subcommand: str) -> RunPlan:
    """Resolves ``--ckpt_path last|best|auto`` in CONFIG (a subcommand's parsed config), points the loggers at the
    run it continues, and refuses a fresh fit over an earlier run's checkpoints. A requeued SLURM job continues its
    own run. Raises ``RunFolderError``."""
    default_save_dirs(config.trainer)
    if config.ckpt_path == "auto":
        plan = resume_if_possible(config)
    elif config.ckpt_path in ("last", "best"):
        plan = use_newest_run(config, resume=subcommand == "fit")
    elif subcommand == "fit" and config.ckpt_path is None:
        plan = start_new_run(config)
    else:
        plan = RunPlan()
    if not config.trainer.get("logger") and (subcommand != "fit" or config.ckpt_path):
        # Without a logger every command saves its config in default_root_dir (Lightning's log_dir): later ones beside.
        kind = "resume" if subcommand == "fit" else subcommand
        plan.config_filename = attempt_config_name(Path(config.trainer.get("default_root_dir") or "."), kind)
    return plan


def program_name(argv0: str) -> str:
    """How the user called us, for usage and error lines: ``python -m project`` or the console command."""
    return f"python -m {program.package}" if Path(argv0).name == "__main__.py" else Path(argv0).name


def resume_command(argv: list[str]) -> str:
    """The command that resumes the run this process trains, from ARGV (``sys.argv``): the same command, with
    ``--ckpt_path last`` in place of any ``--ckpt_path`` it had."""
    args, rest = [], iter(argv[1:])
    for arg in rest:
        if arg == "--ckpt_path":
            next(rest, None)
        elif not arg.startswith("--ckpt_path="):
            args.append(arg)
    return shlex.join([*program_name(argv[0]).split(), *args, "--ckpt_path", "last"])


def use_newest_run(config: Namespace, resume: bool) -> RunPlan:
    which = config.ckpt_path
    try:
        found = find_checkpoint(config, which)
    except ValueError as error:
        raise RunFolderError(str(error)) from None
    if found is None:
        where = fixed_checkpoint_folder(config) or versions_folder(config.trainer)
        raise RunFolderError(f"--ckpt_path {which}: no run with a last.ckpt in {where}; start one with fit")
    config.ckpt_path, folder = str(found[0]), found[1]
    plan = continue_run(config, folder) if resume and folder is not None else RunPlan()  # refused if held
    rank_zero_only(report)(f"{'resuming from' if resume else 'loading'} {config.ckpt_path}")
    return plan


def resume_if_possible(config: Namespace) -> RunPlan:
    """``fit --ckpt_path auto``, for jobs that restart themselves (torchrun ``--max-restarts``, Kubernetes): resume
    the newest run when it has a checkpoint, else start. A torchrun restart continues the newest run's folder even
    before its first checkpoint, so it never resumes an older run."""
    restarted, newest = restart_count() > 0, find_checkpoint(config, "last")
    folders = run_folders(config) if fixed_checkpoint_folder(config) is None else []
    if restarted and folders and (newest is None or newest[1] != folders[0]):
        config.ckpt_path = None
        rank_zero_only(report)(f"--ckpt_path auto: restart {restart_count()}, no checkpoint yet: starting over")
        return continue_run(config, folders[0])
    if newest is not None:
        config.ckpt_path = "last"
        plan = use_newest_run(config, resume=True)
        if restarted and plan.folder is not None:
            plan.restart = record_restart(plan.folder, f"torchrun restart {restart_count()}")
        return plan
    config.ckpt_path = None
    rank_zero_only(report)("--ckpt_path auto: no checkpoint to resume, starting a new run")
    return start_new_run(config)


def start_new_run(config: Namespace) -> RunPlan:
    """A fresh fit gets its own run folder (claimed by the logger); where every run shares one, refuse to write over
    an earlier run. A requeued SLURM job (``SLURM_RESTART_COUNT`` > 0) continues the run its job started instead."""
    job, requeues = slurm_job_id(), int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    restarts = srun_restart_count()  # srun steps restarted within the allocation (scripts/slurm.sbatch)
    if job and requeues + restarts > 0 and (folder := job_run_folder(config, job)) is not None:
        last = (fixed_checkpoint_folder(config) or folder / "checkpoints") / "last.ckpt"  # a file, or FSDP2's folder
        recover_interrupted_save(last)
        config.ckpt_path = str(last) if last.exists() else None
        what = f"resuming from {last}" if config.ckpt_path else "no checkpoint yet: starting over in its folder"
        attempt = f"requeued {requeues} time(s)" + (f", restart {restarts} in this allocation" if restarts else "")
        rank_zero_only(report)(f"SLURM job {job}, {attempt}: {what}")
        if restarts:
            restart = record_restart(folder, f"SLURM job {job}, restart {restarts} in its allocation")
        else:  # the first step of a requeued job
            restart = record_restart(
                folder, f"SLURM job {job}, requeue {requeues}", "requeued (time limit, preemption or lost node)"
            )
        plan = continue_run(config, folder)
        plan.restart = restart
        return plan
    fixed = fixed_checkpoint_folder(config)
    if fixed is not None and any(fixed.glob("*.ckpt")):
        raise RunFolderError(
            f"the checkpoint folder already holds an earlier run's checkpoints ({fixed}); resume with"
            " --ckpt_path last, or choose a new --trainer.default_root_dir"
        )
    return RunPlan()


def claim_run_folder(root: Path) -> int:
    """Creates the next ``version_N`` under ROOT and returns N. ``mkdir`` either creates a folder or fails: of fits
    that start at the same moment into one ``default_root_dir`` (a job array, two jobs), each gets its own. Lightning's
    logger would pick one above the highest it lists, and two starts could pick the same (#11418, won't fix). The
    claiming process holds it (runs/lock.py), so a later ``fit --ckpt_path last`` cannot train in it alongside."""
    root.mkdir(parents=True, exist_ok=True)
    version = next_run_number(root)
    while True:
        try:
            (root / f"version_{version}").mkdir()
        except FileExistsError:
            version += 1
            continue
        hold(root / f"version_{version}")  # new: nobody else holds it, but a later resume must find it held
        return version


def next_run_number(root: Path) -> int:
    """One above the highest ``version_N`` under ROOT (0 when there is none)."""
    numbers = (int(m.group(1)) for p in root.iterdir() if (m := RUN_FOLDER.fullmatch(p.name))) if root.is_dir() else ()
    return max(numbers, default=-1) + 1


def slurm_job_id() -> str | None:
    """This SLURM job's id (``JOB_TASK`` for an array task), when the run is a SLURM job's."""
    if not SLURMEnvironment.detect():
        return None
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    return f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")


def job_run_folder(config: Namespace, job: str) -> Path | None:
    """The newest run folder that SLURM job JOB last trained in."""
    if versions_folder(config.trainer) is None:
        return None
    for folder in run_folders(config):
        if (folder / JOB_FILE).is_file() and (folder / JOB_FILE).read_text().strip() == job:
            return folder
    return None


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
        last = checkpoints / "last.ckpt"  # a file, or a sharded checkpoint's folder (FSDP2)
        recover_interrupted_save(last)
        if last.exists():
            return (last if which == "last" else best_checkpoint(last)), folder
    return None


def best_checkpoint(last: Path) -> Path:
    """The best checkpoint ModelCheckpoint recorded in LAST (its state travels in every checkpoint it writes)."""
    states = checkpoint_meta(last).get("callbacks", {})
    best = [state["best_model_path"] for key, state in states.items() if key.startswith("ModelCheckpoint")]
    if not best or not best[0]:
        raise ValueError(f"--ckpt_path best: {last} records no best checkpoint (is checkpoint.monitor set?)")
    return last.parent / Path(best[0]).name  # the same file, wherever the run folder has moved since


def describe_checkpoint(checkpoint: str, named: str | None) -> str:
    """CHECKPOINT as a message names it: with the run ``--ckpt_path last|best|auto`` (NAMED) found it in."""
    if named not in ("last", "best", "auto"):
        return f"the checkpoint {checkpoint}"
    folder = Path(checkpoint).parent
    run = folder.parent if folder.name == "checkpoints" else folder
    return f"--ckpt_path {named} found the run {run}, whose checkpoint {checkpoint}"


def check_found_network(config: Namespace, named: str | None) -> None:
    """Refuses a checkpoint ``--ckpt_path last|best|auto`` (NAMED) found whose network is another class than the
    config's: the newest run in the folder is another experiment's. Lightning would build the checkpoint's network
    instead (its saved hyperparameters win), against data it was not made for."""
    if named not in ("last", "best", "auto") or not config.ckpt_path:
        return
    ours = config.model.get("network")
    theirs = checkpoint_meta(config.ckpt_path).get("hyper_parameters", {}).get("network")
    if not isinstance(ours, Namespace) or not isinstance(theirs, dict) or "class_path" not in theirs:
        return
    if theirs["class_path"] != ours.class_path:
        raise RunFolderError(
            f"{describe_checkpoint(config.ckpt_path, named)} holds a {theirs['class_path']}, the config's network is"
            f" a {ours.class_path}: {ANOTHER_EXPERIMENT}"
        )


def continue_run(config: Namespace, folder: Path) -> RunPlan:
    """Points the loggers at run FOLDER's own runs, so a resumed fit logs where it did before; the plan has a free
    name for this attempt's config file (the run's first ``config.yaml`` is kept as it was). The run's owner holds
    the folder first (runs/lock.py): ``RunFolderHeld`` while another process trains in it."""
    if owns_runs():
        hold(folder)
    loggers = logger_configs(config.trainer)
    loggers[0].init_args.version = int(RUN_FOLDER.fullmatch(folder.name).group(1))
    trackers = json.loads((folder / TRACKERS_FILE).read_text()) if (folder / TRACKERS_FILE).is_file() else {}
    for index, logger in enumerate(loggers[1:], start=1):
        run_id = trackers.get(str(index), {}).get("run_id")
        arg = next((name for name in RUN_ID_ARGS if name in logger.init_args), None)
        if run_id and arg and logger.class_path.rsplit(".", 1)[-1] == trackers[str(index)]["logger"]:
            logger.init_args[arg] = run_id
    return RunPlan(attempt_config_name(folder), folder)


def attempt_config_name(folder: Path, kind: str = "resume") -> str:
    """The name of this attempt's config in FOLDER: ``config.yaml`` first, then ``config.KIND-N.yaml`` (a resume's,
    or without a logger a test's: ``config.test-2.yaml``)."""
    earlier = list(folder.glob("config*.yaml"))
    return f"config.{kind}-{len(earlier)}.yaml" if earlier else "config.yaml"


def restart_count_known() -> bool:
    """Whether torchrun started this process (and may restart it)."""
    return "TORCHELASTIC_RESTART_COUNT" in os.environ


def is_empty_log(path: Path) -> bool:
    """A metrics file with at most its header line: no metric logged yet."""
    return path.name == "metrics.csv" and path.read_text().count("\n") <= 1


def holds_nothing_to_keep(folder: Path) -> bool:
    """Whether run FOLDER holds only what a run writes as it starts (and its failures' tracebacks): no checkpoint, no
    metric. A new run that fails so leaves no folder (``RunRecord``), nor its tracebacks there (runs/failures.py)."""
    files = [path for path in folder.rglob("*") if path.is_file()] if folder.is_dir() else []
    return all(any(path.match(name) for name in START_FILES) or is_empty_log(path) for path in files)


def restart_count() -> int:
    """How often this torchrun job has been restarted: by torchrun (``--max-restarts``), then warm within each."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + warm_generation()


class RunRecord(SaveConfigCallback):
    """Lightning's config saving, plus: the resolved config as the trackers' parameters (on a run's first attempt;
    trackers refuse to change a parameter), each tracker's run id in ``trackers.json`` so a resume continues it, and
    no run folder left by a new run that fails before it has written anything but its start files.

    Args:
        new_run: the run claims a new folder (not a resumed run's, which is always kept).
        **kwargs: ``SaveConfigCallback``'s.
    """

    def __init__(self, *args: Any, new_run: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_run = new_run

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """Removes the folder of a new run that failed (not one interrupted: Ctrl-C, SIGTERM) before it wrote a
        checkpoint or a metric: an empty run would be the newest for ``--ckpt_path last`` and hide the real ones.
        Not under torchrun, whose restart continues the newest folder (``resume_if_possible``)."""
        if not self.new_run or not isinstance(exception, Exception) or restart_count_known() or not trainer.loggers:
            return
        if trainer.global_rank != 0 or (folder := getattr(trainer.loggers[0], "log_dir", None)) is None:
            return
        folder = Path(folder)
        if not holds_nothing_to_keep(folder):
            return
        shutil.rmtree(folder, ignore_errors=True)
        for parent in (folder.parent, Path(trainer.default_root_dir)):  # what claiming the folder created
            with contextlib.suppress(OSError):  # not empty: other runs' folders
                parent.rmdir()

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not trainer.loggers:
            return
        run_folder = getattr(trainer.loggers[0], "log_dir", None)
        if stage == "fit" and (job := slurm_job_id()) and run_folder:
            (Path(run_folder) / JOB_FILE).write_text(job + "\n")  # a requeue of this job finds its run by it
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
