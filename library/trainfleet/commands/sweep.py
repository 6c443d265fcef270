"""Hyperparameter sweeps with Optuna: ``python -m project sweep --space configs/sweep.yaml -- FIT ARGS``.

Each trial is a real ``python -m project fit`` (any number of processes, whatever FIT ARGS say) with the trial's
values as command-line flags. The study lives in a database (SQLite by default), so a stopped sweep resumes where it
was and several machines can share one study. Trials report ``val_acc`` every epoch; the pruner stops poor ones
early (``OptunaPruning``, added to each trial's callbacks). The best trial's config is written out, ready to rerun.

On a SLURM cluster, ``--slurm-array K`` submits the trials as a job array (``scripts/slurm_sweep.sbatch``), K at a
time, each array task one trial on the resources ``--sbatch`` gives it (any number of nodes); the study's database
(SQLite by default) lies on the shared folder. The command waits for the array, then writes the best config.
"""

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import Callback, LightningModule, Trainer

from trainfleet import program

OBJECTIVE = "val_acc"


class OptunaPruning(Callback):
    """Reports ``val_acc`` to the trial after each validation; stops the fit on every rank when the pruner says so.

    Only rank 0 talks to the study; its decision is broadcast, so every rank stops at the same epoch.
    """

    def __init__(self, storage: str, study_name: str, trial_number: int) -> None:
        self.storage, self.study_name, self.trial_number = storage, study_name, trial_number

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        if trainer.is_global_zero:
            import optuna

            # The trial, reattached from this process through Optuna's public storage API.
            storage = optuna.storages.get_storage(self.storage)
            study_id = storage.get_study_id_from_name(self.study_name)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, self.trial_number)
            trial = optuna.Trial(optuna.load_study(study_name=self.study_name, storage=storage), trial_id)
            value = float(trainer.callback_metrics[OBJECTIVE])
            trial.report(value, trainer.current_epoch)
            trial.set_user_attr(OBJECTIVE, value)
            prune = trial.should_prune()
            if prune:
                trial.set_user_attr("pruned_at_epoch", trainer.current_epoch)
        if trainer.strategy.broadcast(prune):
            trainer.should_stop = True


def distribution(key: str, spec: Any) -> Any:
    """An Optuna distribution from a space entry: ``{low, high[, log, step]}`` or ``{choices: [...]}``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(spec, dict) and set(spec) == {"choices"} and isinstance(spec["choices"], list) and spec["choices"]:
        return CategoricalDistribution([json.dumps(choice) for choice in spec["choices"]])
    if not (isinstance(spec, dict) and {"low", "high"} <= set(spec) <= {"low", "high", "log", "step"}):
        raise ValueError(f"{key}: give {{low, high}} (optionally log, step) or {{choices: [...]}}, got {spec!r}")
    low, high = spec["low"], spec["high"]
    if not (isinstance(low, int | float) and isinstance(high, int | float) and low < high):
        raise ValueError(f"{key}: low must be a number below high, got low={low!r} high={high!r}")
    if spec.get("log") and low <= 0:
        raise ValueError(f"{key}: a log range needs low > 0, got {low}")
    if isinstance(low, int) and isinstance(high, int) and not isinstance(spec.get("step", 1), float):
        return IntDistribution(low, high, log=bool(spec.get("log")), step=spec.get("step", 1))
    return FloatDistribution(float(low), float(high), log=bool(spec.get("log")), step=spec.get("step"))


def flags(params: dict[str, Any]) -> list[str]:
    """The trial's values as CLI flags (categorical values travel as JSON, which the CLI parses)."""
    return [part for key, value in params.items() for part in (f"--{key}", str(value))]


def check_keys(fit_args: list[str], space: dict[str, Any]) -> None:
    """Parses the fit command with a value of every key, as the CLI would: an unknown key or a wrong type exits 2."""
    from trainfleet.cli import build_cli

    sample = {key: dist.choices[0] if hasattr(dist, "choices") else dist.low for key, dist in space.items()}
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the printed config
            build_cli(["fit", *fit_args, *flags(sample), "--print_config"], prog="python -m project")
    except SystemExit as exit_info:
        if exit_info.code:
            raise SystemExit(2) from None


def slurm_launch() -> tuple[list[str], list[str]]:
    """Inside a SLURM job, the fit runs as every task of the allocation (what scripts/slurm.sbatch does): srun before
    the command, the allocation's nodes and tasks per node after it. Elsewhere, nothing."""
    if "SLURM_JOB_ID" not in os.environ or "SLURM_NNODES" not in os.environ:
        return [], []
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]  # "2(x3)": 2 tasks on each of 3 nodes
    return ["srun", "--kill-on-bad-exit=1"], [
        "--trainer.num_nodes",
        os.environ["SLURM_NNODES"],
        "--trainer.devices",
        tasks,
    ]


def run_trial(trial: Any, study_name: str, storage: str, fit_args: list[str], root: Path) -> Any:
    """One real fit of this template (as every task of a SLURM job's allocation, inside one); returns the trial's
    final state and value."""
    from optuna.trial import TrialState

    run_dir = root / f"trial-{trial.number}"
    pruning = [
        "--trainer.callbacks+=trainfleet.commands.sweep.OptunaPruning",
        *("--trainer.callbacks.storage", storage, "--trainer.callbacks.study_name", study_name),
        *("--trainer.callbacks.trial_number", str(trial.number)),
    ]
    launcher, allocation = slurm_launch()
    command = [*launcher, sys.executable, "-m", program.package, "fit", *fit_args, *allocation]
    command += ["--trainer.default_root_dir", str(run_dir)]
    print(f"[sweep] trial {trial.number}: {json.dumps(trial.params)}", flush=True)
    result = subprocess.run([*command, *flags(trial.params), *pruning])
    trial.set_user_attr("run_dir", str(run_dir))
    [attrs] = [frozen.user_attrs for frozen in trial.study.get_trials(deepcopy=False) if frozen.number == trial.number]
    if result.returncode != 0 or OBJECTIVE not in attrs:
        print(f"[sweep] trial {trial.number} failed (exit code {result.returncode}); the sweep goes on", flush=True)
        return TrialState.FAIL, None
    if "pruned_at_epoch" in attrs:
        return TrialState.PRUNED, None
    return TrialState.COMPLETE, attrs[OBJECTIVE]


def write_best_config(study: Any, path: Path) -> None:
    """The best trial's saved config without the pruning callback: `fit --config PATH` reruns that trial."""
    best = study.best_trial
    [saved] = Path(best.user_attrs["run_dir"]).glob("lightning_logs/version_*/config.yaml")
    config = yaml.safe_load(saved.read_text())
    callbacks = [
        cb for cb in config["trainer"].get("callbacks") or [] if not cb["class_path"].endswith("OptunaPruning")
    ]
    config["trainer"]["callbacks"] = callbacks or None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"[sweep] best: trial {best.number}, {OBJECTIVE} {best.value:.4f}, {best.params}; config: {path}")


def submit_array(args: argparse.Namespace, fit_args: list[str], trials: int) -> None:
    """Submits TRIALS array tasks, each running ``sweep --one-trial`` with this sweep's arguments, and waits for them
    (``sbatch --wait``); a failed trial is the study's to record, so the sweep goes on to its best config."""
    if trials < 1:
        return
    sweep = ["--space", str(args.space), "--trials", str(args.trials), "--study", args.study]
    sweep += ["--storage", args.storage, "--root", str(args.root), "--seed", str(args.seed)]
    sweep += ["--prune" if args.prune else "--no-prune", "--", *fit_args]
    array = f"--array=0-{trials - 1}%{args.slurm_array}"
    command = ["sbatch", "--wait", "--parsable", array, *shlex.split(args.sbatch), str(args.sbatch_script), *sweep]
    print(
        f"[sweep] {trials} trials as a SLURM job array, {args.slurm_array} at once: {shlex.join(command)}", flush=True
    )
    done = subprocess.run(command, capture_output=True, text=True)
    print(f"[sweep] job array {done.stdout.strip() or '(not submitted)'} ended with {done.returncode}", flush=True)
    if not done.stdout.strip():
        raise SystemExit(f"[sweep] sbatch failed: {done.stderr.strip()}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m project sweep", description=__doc__.splitlines()[0])
    parser.add_argument("--space", type=Path, required=True, help="YAML: CLI key -> {low, high[, log]} or {choices}")
    parser.add_argument("--trials", type=int, default=20, help="finished trials the study should reach in all")
    parser.add_argument("--study", default="sweep", help="study name in the database")
    parser.add_argument("--storage", default="sqlite:///runs/sweep.db", help="Optuna storage URL")
    parser.add_argument("--root", type=Path, default=Path("runs/sweep"), help="trial run folders go under ROOT/STUDY")
    parser.add_argument("--seed", type=int, default=0, help="seeds the sampler")
    parser.add_argument("--prune", action=argparse.BooleanOptionalAction, default=True, help="stop poor trials early")
    parser.add_argument(
        "--slurm-array", type=int, metavar="K", help="submit the trials as a SLURM job array, K at once"
    )
    parser.add_argument("--sbatch", default="", help="sbatch options for each trial, e.g. '--nodes=2 --time=1:00:00'")
    parser.add_argument("--sbatch-script", type=Path, default=Path("scripts/slurm_sweep.sbatch"), help="%(default)s")
    parser.add_argument("--one-trial", action="store_true", help="run one trial and stop (what each array task does)")
    parser.add_argument("fit_args", nargs=argparse.REMAINDER, help="-- then the fit command's flags (--config ...)")
    args = parser.parse_args(argv)
    if args.slurm_array is not None and (args.slurm_array < 1 or not args.sbatch_script.is_file()):
        parser.error(f"--slurm-array needs K >= 1 and the array script {args.sbatch_script}")
    fit_args = args.fit_args[1:] if args.fit_args[:1] == ["--"] else args.fit_args
    try:
        import optuna
    except ImportError:
        parser.error("sweeps need Optuna: pip install -e '.[sweep]'")
    try:
        space = {key: distribution(key, spec) for key, spec in yaml.safe_load(args.space.read_text()).items()}
    except (OSError, AttributeError, ValueError, yaml.YAMLError) as error:
        parser.error(f"search space {args.space}: {error}")
    check_keys(fit_args, space)
    study = optuna.create_study(
        study_name=args.study,
        storage=args.storage,
        direction="maximize",
        # An array task is a process of its own: seeded apart, or every task would draw the same first trials.
        sampler=optuna.samplers.TPESampler(seed=args.seed + int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2) if args.prune else optuna.pruners.NopPruner(),
        load_if_exists=True,
    )
    definition = json.dumps({"space": {k: repr(v) for k, v in space.items()}, "fit_args": fit_args}, sort_keys=True)
    if study.user_attrs.setdefault("definition", definition) != definition:
        parser.error(f"study {args.study!r} in {args.storage} was started with another space or fit command")
    study.set_user_attr("definition", definition)
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    if args.slurm_array is not None:  # the trials run in the array; a task that died is the study's FAIL or RUNNING
        submit_array(args, fit_args, args.trials - len(study.get_trials(states=finished)))
    while args.slurm_array is None and len(study.get_trials(states=finished)) < args.trials:
        trial = study.ask(space)
        state, value = run_trial(trial, args.study, args.storage, fit_args, args.root / args.study)
        study.tell(trial, value, state=state)
        if args.one_trial:
            return 0
    if args.one_trial:
        return 0
    if not study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        print("[sweep] no trial completed", file=sys.stderr)
        return 1
    write_best_config(study, args.root / args.study / "best.yaml")
    return 0
