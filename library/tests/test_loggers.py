"""What a run leaves to look at: CSV metrics with the learning rate, a PNG of the curves, TensorBoard
events when selected; and the interactive defaults (Rich progress bar), each of which can be turned off."""

import importlib.util
import math
import struct
import subprocess
import sys

import pytest
from helpers import DIGITS_CONFIG, REPO, metrics_rows, quick_args, run_folder, run_project
from lightning.pytorch.callbacks import LearningRateMonitor, RichProgressBar
from project.module import ClassificationModule

from trainfleet.cli import ProjectCLI
from trainfleet.data import InMemoryDataModule
from trainfleet.runs.outputs import ProgressBar

PLOT_SCRIPT = REPO / "scripts" / "plot_metrics.py"


def load_plot_metrics():
    spec = importlib.util.spec_from_file_location("plot_metrics", PLOT_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A real 2-epoch fit with the default CSVLogger."""
    run_dir = tmp_path_factory.mktemp("csv_run")
    result = run_project("fit", *quick_args(run_dir, "--trainer.max_epochs", "2"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_csv_log_holds_epoch_metrics_and_the_learning_rate_per_step_a_cosine_to_the_run_end(csv_run):
    rows = metrics_rows(run_folder(csv_run, 0))
    assert [float(r["val_acc"]) > 0.3 for r in rows if r["val_acc"]] == [True, True]
    assert len([r for r in rows if r["train_acc"]]) == 2
    # digits.yaml: WarmupCosineLR from lr 0.1 over the run's 40 steps (2 epochs of 20), no warm-up, logged by the
    # learning-rate monitor every log_every_n_steps (10) steps: the rate the step at `step` used.
    lrs = {int(r["step"]): float(r["lr-SGD"]) for r in rows if r["lr-SGD"]}
    assert lrs == pytest.approx({step: 0.1 * (1 + math.cos(math.pi * step / 40)) / 2 for step in (9, 19, 29, 39)})


@pytest.mark.slow
def test_plot_metrics_takes_the_epoch_losses_and_the_log_has_the_step_losses_too(csv_run):
    rows = metrics_rows(run_folder(csv_run, 0))
    curves = load_plot_metrics().per_epoch(csv_run / "lightning_logs" / "version_0" / "metrics.csv")
    [epoch0_loss] = [float(r["train_loss"]) for r in rows if r["train_loss"] and r["epoch"] == "0"]
    assert curves["train_loss"][0] == pytest.approx(epoch0_loss)
    step_losses = [float(r["train_loss_step"]) for r in rows if r["train_loss_step"] and r["epoch"] == "0"]
    assert len(step_losses) == 2  # 20 steps, a window of 10 logged at a time
    assert epoch0_loss == pytest.approx(sum(step_losses) / 2, rel=0.05)  # equal windows: nearly the epoch's mean
    assert sorted(curves["val_acc"]) == [0, 1] and sorted(curves["train_acc"]) == [0, 1]


@pytest.mark.slow
def test_plot_metrics_writes_a_png_from_the_run_folder(csv_run, tmp_path):
    out = tmp_path / "curves.png"
    result = subprocess.run(
        [sys.executable, str(PLOT_SCRIPT), str(csv_run), "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1320, 480)  # 11 x 4 inches at 120 dpi
    assert len(data) > 20_000  # drawn curves, not an empty canvas


@pytest.mark.slow
def test_plot_metrics_rejects_a_folder_without_metrics(tmp_path):
    result = subprocess.run([sys.executable, str(PLOT_SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2 and "no metrics.csv" in result.stderr


@pytest.mark.slow
def test_tensorboard_overlay_writes_event_files_into_the_same_layout(tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    args = quick_args(tmp_path, "--config", "configs/tensorboard.yaml", "--trainer.max_epochs", "1")
    result = run_project("fit", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    [events] = (tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*")
    accumulator = event_accumulator.EventAccumulator(str(events))
    accumulator.Reload()
    assert {"train_loss", "val_acc", "lr-SGD"} <= set(accumulator.Tags()["scalars"])
    [val_acc] = accumulator.Scalars("val_acc")
    assert val_acc.step == 19 and val_acc.value > 0.3
    assert not list(tmp_path.rglob("metrics.csv"))


@pytest.mark.parametrize(
    ("flags", "progress_bar", "lr_monitor", "redraws_per_second"),
    [
        ([], ProgressBar, True, 2),  # every second batch: its drawing thread competes with training
        (["--trainer.enable_progress_bar", "false"], type(None), True, None),
        (["--trainer.logger", "false"], ProgressBar, False, 2),  # Lightning's monitor raises without a logger
        (["--trainer.callbacks+=RichProgressBar", "--trainer.callbacks.refresh_rate=5"], RichProgressBar, True, 5),
    ],
)
def test_interactive_defaults_and_how_to_turn_them_off(
    tmp_path, monkeypatch, flags, progress_bar, lr_monitor, redraws_per_second
):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # pytest's own arguments are not the CLI's
    args = ["--config", str(DIGITS_CONFIG), "--trainer.default_root_dir", str(tmp_path), *flags]
    cli = ProjectCLI(ClassificationModule, InMemoryDataModule, subclass_mode_data=True, run=False, args=args)
    assert type(cli.trainer.progress_bar_callback) is progress_bar
    assert getattr(cli.trainer.progress_bar_callback, "refresh_rate", None) == redraws_per_second
    assert any(isinstance(c, LearningRateMonitor) for c in cli.trainer.callbacks) is lr_monitor
    assert bool(cli.trainer.loggers) is lr_monitor
