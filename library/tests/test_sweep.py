"""Optuna sweeps through the real CLI: a study in SQLite that survives a stop, trials that are real fits, the best
config that reruns to its recorded accuracy, and bad input refused before any training."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import DIGITS_CONFIG, metric_values, run_folder, run_in_process, run_project

optuna = pytest.importorskip("optuna")

SPACE = {
    "model.optimizer.init_args.lr": {"low": 0.05, "high": 0.3, "log": True},
    "model.network.init_args.hidden_sizes": {"choices": [[64], [128, 64]]},
}
FIT = ["--config", str(DIGITS_CONFIG), "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"]


def run_trial(command: list[str]) -> subprocess.CompletedProcess:
    """A trial's `python -m project fit ...`, run as a process forked from the warm server (helpers.run_project):
    the same fit, without a fresh interpreter's start-up (about 8 s a trial)."""
    assert command[:4] == [sys.executable, "-m", "project", "fit"]
    result = run_project(*command[3:], cwd=Path.cwd())
    sys.stdout.write(result.stdout)
    return result


def sweep(tmp_path: Path, *args: str, space: dict = SPACE, fit: tuple = ()) -> int:
    """`python -m project sweep ARGS` in this process; its trials are real `fit` processes."""
    from trainfleet.commands.sweep import main

    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    command = ["--space", str(tmp_path / "space.yaml"), *args, "--storage", f"sqlite:///{tmp_path}/sweep.db"]
    try:
        with pytest.MonkeyPatch.context() as patch:
            # the sweep's own name only
            patch.setattr("trainfleet.commands.sweep.subprocess", SimpleNamespace(run=run_trial))
            return main([*command, "--root", str(tmp_path / "runs"), "--", *FIT, *fit])
    except SystemExit as exit_info:
        return exit_info.code


def trials(tmp_path: Path, study: str = "sweep") -> list:
    return optuna.load_study(study_name=study, storage=f"sqlite:///{tmp_path}/sweep.db").trials


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sweep")
    assert sweep(tmp_path, "--trials", "1") == 0
    after_stop = len(trials(tmp_path))
    assert sweep(tmp_path, "--trials", "2") == 0
    return tmp_path, after_stop


@pytest.mark.slow
def test_a_stopped_sweep_resumes_to_the_requested_number_of_trials(stopped_and_resumed):
    tmp_path, after_stop = stopped_and_resumed
    assert after_stop == 1
    done = trials(tmp_path)
    assert [trial.number for trial in done] == [0, 1]
    assert {trial.state.name for trial in done} <= {"COMPLETE", "PRUNED"}
    for trial in done:  # every trial was a real fit, with its values on the command line
        config = yaml.safe_load((run_folder(Path(trial.user_attrs["run_dir"])) / "config.yaml").read_text())
        assert config["model"]["optimizer"]["init_args"]["lr"] == pytest.approx(
            trial.params["model.optimizer.init_args.lr"]
        )
        assert config["model"]["network"]["init_args"]["hidden_sizes"] == json.loads(
            trial.params["model.network.init_args.hidden_sizes"]
        )
        assert trial.intermediate_values  # val_acc reported per epoch, for the pruner


@pytest.mark.slow
def test_the_best_config_reruns_to_the_recorded_accuracy(stopped_and_resumed, tmp_path):
    sweep_dir, _ = stopped_and_resumed
    best = optuna.load_study(study_name="sweep", storage=f"sqlite:///{sweep_dir}/sweep.db").best_trial
    config = sweep_dir / "runs" / "sweep" / "best.yaml"
    run_in_process("fit", "--config", str(config), "--trainer.default_root_dir", str(tmp_path))
    val_acc = metric_values(run_folder(tmp_path), "val_acc")
    assert val_acc[-1] == pytest.approx(best.value, abs=1e-6)


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ({"model.no_such_key": {"low": 0.1, "high": 0.2}}, "no_such_key"),
        ({"model.optimizer.init_args.lr": {"low": 0.5, "high": 0.1}}, "low must be a number below high"),
        ({"model.optimizer.init_args.lr": {"low": 0, "high": 0.1, "log": True}}, "a log range needs low > 0"),
        ({"model.optimizer.init_args.lr": [0.1, 0.2]}, "give {low, high}"),
    ],
    ids=["unknown-key", "empty-range", "log-of-zero", "not-a-range"],
)
def test_a_bad_search_space_is_refused_before_training(tmp_path, capsys, space, message):
    assert sweep(tmp_path, "--trials", "1", space=space) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_study_name_started_with_another_space_is_refused(stopped_and_resumed, capsys):
    sweep_dir, _ = stopped_and_resumed
    assert sweep(sweep_dir, "--trials", "5", space={"model.optimizer.init_args.lr": {"low": 0.1, "high": 0.2}}) == 2
    assert "study 'sweep'" in (err := capsys.readouterr().err) and "another space" in err
    assert len(trials(sweep_dir)) == 2


@pytest.mark.slow
def test_a_failed_trial_is_recorded_as_failed_and_the_sweep_goes_on(tmp_path, capsys):
    space = {"model.optimizer.init_args.lr": {"low": 0.05, "high": 0.3}}
    assert sweep(tmp_path, "--trials", "2", "--study", "fails", space=space, fit=("--trainer.max_epochs", "-5")) == 1
    assert [trial.state.name for trial in trials(tmp_path, "fails")] == ["FAIL", "FAIL"]
    assert "no trial completed" in capsys.readouterr().err
