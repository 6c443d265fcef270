"""The README's path, for real: fit with DDP on 2 CPU processes, then test the checkpoint on 1, 2, 3."""

import csv
import json

import pytest
import torch
from helpers import REPO, exec_project, last_checkpoint, quick_args, run_project
from project.data import DigitsDataModule

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp_fit")
    result = exec_project("fit", *quick_args(run_dir, "--trainer.devices", "2"), cwd=REPO)  # the README's way
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def test_metrics(ddp_run, tmp_path_factory):
    """Test metrics of the DDP run's last checkpoint, evaluated on 1, 2 and 3 processes."""
    metrics = {}
    for devices in (1, 2, 3):
        run_dir = tmp_path_factory.mktemp(f"test_{devices}")
        ckpt = str(last_checkpoint(ddp_run))
        result = run_project(
            "test", *quick_args(run_dir, "--trainer.devices", str(devices), "--ckpt_path", ckpt), cwd=REPO
        )
        assert result.returncode == 0, result.stderr[-3000:]
        [path] = run_dir.glob("lightning_logs/version_*/test_metrics.json")
        metrics[devices] = json.loads(path.read_text())
        assert str(path) in result.stdout  # printed as well as written
    return metrics


def test_ddp_fit_writes_last_checkpoint_after_every_epoch(ddp_run):
    ckpt = torch.load(last_checkpoint(ddp_run), weights_only=True)
    # 20 epochs of ceil(1258 / 2 ranks / 64 per batch) = 10 steps each.
    assert ckpt["epoch"] == 19 and ckpt["global_step"] == 200
    assert any(key.startswith("network.") for key in ckpt["state_dict"])
    [config] = ddp_run.glob("lightning_logs/version_0/config.yaml")
    assert "project.networks.MLP" in config.read_text()


def test_checkpoint_reaches_the_target_accuracy(test_metrics):
    assert test_metrics[1]["test_acc"] >= 0.90


def test_accuracy_is_identical_on_one_two_and_three_processes(test_metrics):
    # 359 test samples: not divisible by 2 or 3, so a padding sampler would change the result.
    assert test_metrics[1]["test_acc"] == test_metrics[2]["test_acc"] == test_metrics[3]["test_acc"]
    assert test_metrics[2]["test_loss"] == pytest.approx(test_metrics[1]["test_loss"], rel=1e-5)
    assert test_metrics[3]["test_loss"] == pytest.approx(test_metrics[1]["test_loss"], rel=1e-5)


def test_predict_on_two_processes_writes_every_test_sample_in_order(ddp_run, test_metrics, tmp_path):
    ckpt = str(last_checkpoint(ddp_run))
    args = quick_args(tmp_path, "--trainer.devices", "2", "--ckpt_path", ckpt)
    result = run_project("predict", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = tmp_path.glob("lightning_logs/version_*/predictions.csv")
    with path.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [int(row["input"]) for row in rows] == list(range(359))
    data = DigitsDataModule()
    data.setup("predict")
    labels = data.splits["test"].tensors[1]
    predictions = torch.tensor([int(row["prediction"]) for row in rows])
    assert (predictions == labels).float().mean().item() == pytest.approx(test_metrics[1]["test_acc"])
    probabilities = torch.tensor([[float(row[f"probability_{digit}"]) for digit in range(10)] for row in rows])
    assert torch.equal(probabilities.argmax(dim=1), predictions)
    assert probabilities.sum(dim=1) == pytest.approx(torch.ones(359), abs=1e-5)


def test_saved_config_reruns_the_same_experiment(ddp_run, tmp_path):
    saved = ddp_run / "lightning_logs" / "version_0" / "config.yaml"
    args = ["--config", str(saved), "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1"]
    result = run_project("fit", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert ckpt["global_step"] == 10  # the saved config's 2 devices and batch size 64: 10 steps per epoch
