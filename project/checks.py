"""The settings Lightning accepts but cannot run with, refused before anything starts (the CLI exits 2, naming the key).

Each check is here because, unchecked, the mistake surfaced late and badly (measured with ``python -m project fit
--config configs/digits.yaml`` and the one wrong value):

- a config file whose ``trainer`` (or another section) is not a mapping (``trainer: 3``): jsonargparse takes it, and
  the run was built without the config's callbacks and failed inside the CLI with ``StopIteration``;

- a numeric argument of the Trainer outside the range its meaning gives it (``trainer_ranges.py``, driven by the
  Trainer's signature): ``accumulate_grad_batches``, ``val_check_interval`` or ``check_val_every_n_epoch`` 0 reached a
  ``ZeroDivisionError`` inside Lightning (51-53 lines, exit 1); a negative ``log_every_n_steps``,
  ``gradient_clip_val`` or ``num_sanity_val_steps`` was accepted, and the run went on with a setting that means nothing;
- a launch variable (``MASTER_PORT``, ``NODE_RANK``, torchrun's ``RANK``/``WORLD_SIZE``/...) that cannot work with
  the config (``launch_environment.py``): a traceback from torch or Lightning, or a rendezvous that never came;
- ``seed_everything`` outside numpy's seed range [0, 2**32 - 1]: numpy's bounds error with a traceback;
- ``trainer.default_root_dir`` that cannot be written (a read-only file system, a file on its path): the first
  checkpoint or log line failed, after the run had started;
- ``trainer.max_epochs -1`` (train until ``max_steps`` or ``max_time``) with a schedule that needs the run's length
  in steps and nothing that gives it: ``OverflowError`` when training started (``run_length_problem``);
- more CPU processes on this host than cores it may use (``--trainer.devices 99`` on 2 cores): 99 processes, gloo
  timeouts and 24 tracebacks. ``PROJECT_OVERSUBSCRIBE=1`` insists (``cpu_processes_problem``).
"""

import os
from pathlib import Path

from jsonargparse import Namespace

from project.launch_environment import launch_problem
from project.trainer_ranges import trainer_ranges_problem

SEED_RANGE = (0, 2**32 - 1)  # numpy's: seed_everything seeds numpy too
OVERSUBSCRIBE_VAR = "PROJECT_OVERSUBSCRIBE"  # "1": start more CPU processes than cores anyway
LENGTH_SCHEDULES = ("project.schedules.WarmupCosineLR",)  # schedules fitted to the run's length (module.py)


class SettingsError(ValueError):
    """A setting the run cannot go on with; the CLI prints it and exits 2."""


def check_settings(config: Namespace) -> None:
    """Refuses CONFIG (a subcommand's parsed config) when a check of this module's list fails: the first problem."""
    problem = next(filter(None, (check(config) for check in SETTINGS_CHECKS)), None)
    if problem:
        raise SettingsError(problem)


SECTIONS = ("trainer", "model", "data", "checkpoint", "preemption", "periodic")  # each a class's arguments


def section_problem(config: Namespace) -> str | None:
    for name in SECTIONS:
        value = config.get(name)
        if value is not None and not isinstance(value, Namespace):
            return f"{name} must be a mapping of its arguments (key: value lines under it), got {value!r}"
    return None


def trainer_range_problem(config: Namespace) -> str | None:
    """Each numeric argument of the Trainer in its range (trainer_ranges.py)."""
    return trainer_ranges_problem(config.trainer)


def launch_environment_problem(config: Namespace) -> str | None:
    """The launch environment's variables (launch_environment.py), with the config's numbers of nodes and devices."""
    return launch_problem(config.trainer, os.environ)


def seed_problem(config: Namespace) -> str | None:
    seed = config.get("seed_everything")
    low, high = SEED_RANGE
    if isinstance(seed, int) and not isinstance(seed, bool) and not low <= seed <= high:
        return f"seed_everything must be in [{low}, {high}] (numpy's seed range), or true for a random one; got {seed}"
    return None


def root_dir_problem(config: Namespace) -> str | None:
    """The run's folder must be creatable and writable: its nearest existing ancestor a writable directory."""
    root = Path(config.trainer.get("default_root_dir") or ".").absolute()
    existing = next(path for path in (root, *root.parents) if path.exists())
    if not existing.is_dir():
        return f"trainer.default_root_dir {root} cannot be made: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"trainer.default_root_dir {root} is not writable ({existing} is read-only for this user)"
    return None


def run_length_problem(config: Namespace) -> str | None:
    """``max_epochs -1`` trains until ``max_steps`` or ``max_time``; a schedule fitted to the run's length in steps
    (or epochs) needs one of those in its own unit: ``max_time`` alone says nothing of how many steps it will be."""
    trainer, scheduler = config.trainer, config.get("model", Namespace()).get("scheduler")
    if trainer.get("max_epochs") != -1 or not isinstance(scheduler, Namespace):
        return None
    if scheduler.get("class_path") not in LENGTH_SCHEDULES or scheduler.get("init_args", Namespace()).get(
        "total_steps"
    ):
        return None
    by_epoch = config.model.get("scheduler_interval") == "epoch"
    if trainer.get("max_steps", -1) != -1 and not by_epoch:
        return None  # fitted to max_steps
    name = scheduler.class_path.rpartition(".")[2]
    unit = "epochs (model.scheduler_interval epoch)" if by_epoch else "steps"
    give = "--trainer.max_epochs N" if by_epoch else "--trainer.max_steps N"
    return (
        f"trainer.max_epochs -1 trains until max_steps or max_time, and {name} needs the run's length in {unit}:"
        f" give {give}, or --model.scheduler.init_args.total_steps N (max_time alone does not say how many)"
    )


SETTINGS_CHECKS = (
    section_problem,
    trainer_range_problem,
    seed_problem,
    root_dir_problem,
    run_length_problem,
    launch_environment_problem,
)


def usable_cores() -> int:
    """The cores this process may run on (a container's or a job's share, not the whole machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_processes_problem(processes: int) -> str | None:
    """PROCESSES CPU ranks on this host: each spins at least one core; more than there are time out in gloo."""
    cores = usable_cores()
    if processes <= cores or os.environ.get(OVERSUBSCRIBE_VAR) == "1":
        return None
    return (
        f"trainer.devices {processes} starts {processes} CPU processes on this host, which has {cores} usable"
        f" cores: give --trainer.devices {cores} or fewer, or set {OVERSUBSCRIBE_VAR}=1 to start them anyway"
    )
