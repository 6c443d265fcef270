"""The experiment workflow: trackers on a real store (MLflow on SQLite, W&B offline), and the preset overlays
(best, ema, debug, profile), each run for real and read back."""

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import REPO, checkpoint_dir, metric_values, quick_args, run_folder, run_in_process, run_project

from trainfleet.runtime.faults import wait_until

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

CONFIGS = REPO / "configs"


def overlay(name: str) -> list[str]:
    return ["--config", str(CONFIGS / f"{name}.yaml")]


# MLflow: a 2-process fit, resumed for a second epoch, a rerun, and a test; read back with mlflow's own API.


@pytest.fixture(scope="module")
def mlflow_runs(tmp_path_factory):
    mlflow = pytest.importorskip("mlflow")
    cwd = tmp_path_factory.mktemp("mlflow")
    root = cwd / "runs" / "digits"
    args = [*quick_args(root, "--trainer.max_epochs", "1"), *overlay("mlflow")]
    for extra in ([], ["--trainer.max_epochs", "2", "--ckpt_path", "last"]):  # fit, resume: 2 processes each
        result = run_project("fit", *args, "--trainer.devices", "2", *extra, cwd=cwd)
        assert result.returncode == 0, result.stderr[-3000:]
    saved = os.getcwd()
    os.chdir(cwd)  # the overlay's store is relative to the working directory
    try:
        run_in_process("fit", *args)  # a rerun, on one process
        run_in_process("test", *args, "--ckpt_path", "last")
    finally:
        os.chdir(saved)
    client = mlflow.MlflowClient(f"sqlite:///{cwd}/runs/mlflow.db")
    experiment = client.get_experiment_by_name("digits")
    found = {run.info.run_id: run for run in client.search_runs([experiment.experiment_id])}
    return root, client, found


def tracker_run_id(folder: Path) -> str:
    return json.loads((folder / "trackers.json").read_text())["1"]["run_id"]


def test_mlflow_holds_one_run_per_run_folder_with_the_config_and_the_csv_metrics(mlflow_runs):
    root, client, found = mlflow_runs
    first, rerun, test = (run_folder(root, version) for version in (0, 1, 2))
    assert set(found) == {tracker_run_id(first), tracker_run_id(rerun), tracker_run_id(test)}  # 2 ranks: 1 run
    run = found[tracker_run_id(first)]
    assert run.data.params["trainer.devices"] == "2" and run.data.params["model.optimizer.init_args.lr"] == "0.1"
    assert run.data.params["trainer.max_epochs"] == "1"  # the first attempt's config; the resumed one is beside it
    history = [metric.value for metric in client.get_metric_history(run.info.run_id, "val_acc")]
    assert (
        history == pytest.approx(metric_values(first, "val_acc"), abs=1e-6) and len(history) == 2
    )  # resumed: 2 epochs
    test_acc = json.loads((test / "test_metrics.json").read_text())["test_acc"]
    assert found[tracker_run_id(test)].data.metrics["test_acc"] == pytest.approx(test_acc, abs=1e-6)
    assert "last" in {artifact.path for artifact in client.list_artifacts(run.info.run_id)}  # the checkpoint


def test_a_rerun_is_a_new_mlflow_run_and_a_resume_continues_its_own(mlflow_runs):
    root, client, found = mlflow_runs
    first, rerun = tracker_run_id(run_folder(root, 0)), tracker_run_id(run_folder(root, 1))
    assert first != rerun
    assert len(client.get_metric_history(rerun, "val_acc")) == 1
    assert found[first].info.status == found[rerun].info.status == "FINISHED"


def test_wandb_offline_run_is_written_under_the_run_root(tmp_path):
    wandb = pytest.importorskip("wandb")
    root = tmp_path / "runs"
    run_in_process("fit", *quick_args(root, "--trainer.max_epochs", "1"), *overlay("wandb"))
    wandb.finish()  # what the process's exit does after a command: flush the run
    run_id = tracker_run_id(run_folder(root, 0))
    [offline] = (root / "wandb").glob(f"offline-run-*-{run_id}")
    records = offline / f"run-{run_id}.wandb"  # what `wandb sync` uploads, written by W&B's own service process
    assert wait_until(lambda: records.stat().st_size > 1000, timeout=30)  # which can lag finish() on a busy machine


# Presets.


def test_best_keeps_the_top_checkpoints_by_val_acc_and_test_picks_the_best(tmp_path):
    args = quick_args(tmp_path, "--trainer.max_epochs", "6", *overlay("best"))
    run_in_process("fit", *args)
    folder = checkpoint_dir(tmp_path)
    scored = {path: float(path.stem.split("val_acc=")[1]) for path in folder.glob("epoch=*.ckpt")}
    assert len(scored) == 3 and (folder / "last.ckpt").is_file()
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 5  # last.ckpt: every epoch, not the best
    best = max(scored, key=scored.get)
    printed = run_in_process("test", *args, "--ckpt_path", "best")
    assert f"[project] loading {best}" in printed


def test_ema_validates_and_saves_the_averaged_weights(tmp_path):
    run_in_process("fit", *quick_args(tmp_path, "--trainer.max_epochs", "3", *overlay("ema")))
    ckpt = torch.load(checkpoint_dir(tmp_path) / "last.ckpt", weights_only=True)
    averaged, current = ckpt["state_dict"], ckpt["current_model_state"]
    assert averaged.keys() == current.keys()
    assert not torch.equal(averaged["network.layers.1.weight"], current["network.layers.1.weight"])


def test_debug_runs_two_batches_with_anomaly_detection_and_writes_nothing(tmp_path):
    printed = run_in_process("fit", *quick_args(tmp_path / "run", *overlay("debug")))
    assert "Running in `fast_dev_run` mode: will run the requested loop using 2 batch(es)" in printed
    assert "`Trainer(detect_anomaly=True)`" in printed and "`max_steps=2` reached" in printed
    assert not (tmp_path / "run").exists()


def test_profile_writes_a_trace_into_the_run_folder(tmp_path):
    run_in_process("fit", *quick_args(tmp_path, *overlay("profile")))
    [trace] = run_folder(tmp_path).glob("fit-profile*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("training_step" in event.get("name", "") for event in events)
