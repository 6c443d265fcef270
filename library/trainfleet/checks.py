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
  and nothing that gives it (neither ``max_steps`` nor ``max_time``; for a schedule stepped per epoch, ``max_epochs``
  only): ``OverflowError`` when training started (``run_length_problem``);
- far more CPU processes on this host than cores it may use (``--trainer.devices 99`` on 2 cores): 99 processes,
  gloo timeouts and 24 tracebacks; or more than its available memory holds. A modest excess (up to
  ``PROCESSES_PER_CORE`` a core) runs, slower, with a one-line note (``cpu_processes_note``): 3 processes on 2 cores
  is how the test suite gets uneven shards. ``PROJECT_OVERSUBSCRIBE=1`` insists past the refusal
  (``cpu_processes_problem``).
"""

import os
from pathlib import Path

from jsonargparse import Namespace

from trainfleet.launch_environment import launch_problem
from trainfleet.trainer_ranges import trainer_ranges_problem

SEED_RANGE = (0, 2**32 - 1)  # numpy's: seed_everything seeds numpy too
OVERSUBSCRIBE_VAR = "PROJECT_OVERSUBSCRIBE"  # "1": start CPU processes past the limits below anyway
# CPU processes a usable core runs (slower, with a note); more are refused. Measured on 2 cores, digits, 60 steps:
# 2 processes 54-76 steps/s, 8 (4 a core) 6.3-7.6 steps/s (still 55-66% of one process's samples/s), 16 (8 a core)
# 1.8 steps/s (31%, a step 37x as long as with 2): past 4 a core more processes only cost; 99 timed out in gloo.
PROCESSES_PER_CORE = 4
# A forked CPU rank's own memory (private pages, smaps_rollup) at step 30 of a digits fit: 178-179 MB (RSS 605 MB, the
# rest shared with rank 0). No model is smaller, so more processes than the available memory holds at this is refused.
RANK_MEMORY_MB = 180
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
    """``max_epochs -1`` trains until ``max_steps`` or ``max_time``; a schedule fitted to the run's length needs one of
    them: a step schedule takes either (``max_time`` through the run's measured pace: ``time_budget.py``), a schedule
    stepped per epoch needs ``max_epochs`` (a time budget is not measured in epochs)."""
    trainer, scheduler = config.trainer, config.get("model", Namespace()).get("scheduler")
    if trainer.get("max_epochs") != -1 or not isinstance(scheduler, Namespace):
        return None
    if scheduler.get("class_path") not in LENGTH_SCHEDULES or scheduler.get("init_args", Namespace()).get(
        "total_steps"
    ):
        return None
    by_epoch = config.model.get("scheduler_interval") == "epoch"
    if not by_epoch and (trainer.get("max_steps", -1) != -1 or trainer.get("max_time") is not None):
        return None  # fitted to max_steps, or to the steps max_time allows at the measured pace
    name = scheduler.class_path.rpartition(".")[2]
    if by_epoch:
        return (
            f"trainer.max_epochs -1 trains until max_steps or max_time, and {name} stepped per epoch"
            " (model.scheduler_interval epoch) needs the run's length in epochs: give --trainer.max_epochs N"
        )
    return (
        f"trainer.max_epochs -1 trains until max_steps or max_time, and {name} needs the run's length: give"
        " --trainer.max_steps N, --trainer.max_time DD:HH:MM:SS, or --model.scheduler.init_args.total_steps N"
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


def available_memory_mb() -> float | None:
    """What new processes can still take, in MB: the kernel's ``MemAvailable``, or less under a container's (cgroup
    v2) limit; None where neither can be read."""
    found = []
    try:
        meminfo = Path("/proc/meminfo").read_text().splitlines()
        found += [int(line.split()[1]) / 1024 for line in meminfo if line.startswith("MemAvailable:")]
    except OSError:
        pass
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append((int(limit) - int((cgroup / "memory.current").read_text())) / 2**20)
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def cpu_processes_note(processes: int) -> str | None:
    """A modest excess of CPU processes over cores runs: the note says what it costs (each step waits for a core).
    None with ``PROJECT_OVERSUBSCRIBE=1``: who set it knows (the test suite's 3 ranks on 2 cores, for uneven shards)."""
    cores = usable_cores()
    if processes <= cores or os.environ.get(OVERSUBSCRIBE_VAR) == "1":
        return None
    return (
        f"{processes} processes on {cores} cores: each step waits for a core, so steps are slower than with {cores};"
        f" up to {PROCESSES_PER_CORE * cores} run ({PROCESSES_PER_CORE} a core), more are refused"
    )


def cpu_processes_problem(processes: int) -> str | None:
    """PROCESSES CPU ranks on this host refused where they cannot work: more than ``PROCESSES_PER_CORE`` per usable
    core, or more than the available memory holds at ``RANK_MEMORY_MB`` each. ``PROJECT_OVERSUBSCRIBE=1`` insists."""
    if os.environ.get(OVERSUBSCRIBE_VAR) == "1":
        return None
    cores, memory = usable_cores(), available_memory_mb()
    insist = f"or set {OVERSUBSCRIBE_VAR}=1 to start them anyway"
    if processes > PROCESSES_PER_CORE * cores:
        return (
            f"trainer.devices {processes} starts {processes} CPU processes on this host, which has {cores} usable"
            f" cores (at most {PROCESSES_PER_CORE} processes a core run): give --trainer.devices"
            f" {PROCESSES_PER_CORE * cores} or fewer ({cores} is fastest), {insist}"
        )
    if memory is not None and processes > 1 and processes * RANK_MEMORY_MB > memory:
        fit = max(1, int(memory // RANK_MEMORY_MB))
        return (
            f"trainer.devices {processes} starts {processes} CPU processes on this host, and {memory:.0f} MB of memory"
            f" is available, {RANK_MEMORY_MB} MB a process at least: give --trainer.devices {fit} or fewer, {insist}"
        )
    return None
