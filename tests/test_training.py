"""A short real fit of this project, as its README runs it: two processes (DDP over gloo on CPU), then the
test set from the run's last checkpoint. What the library's own tests cannot know: that this project's
network, module and data learn together."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(tmp_path: Path, command: str, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two ranks on a small machine: one thread each
    args = ["--config", str(ROOT / "configs" / "digits.yaml"), f"--trainer.default_root_dir={tmp_path}", *flags]
    command_line = [sys.executable, "-m", "project", command, *args]
    return subprocess.run(command_line, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("fit")
    fit = run(root, "fit", "--trainer.devices=2", "--trainer.max_epochs=10", "--trainer.enable_progress_bar=false")
    return root, fit


def test_two_processes_learn_the_digits(fitted):
    root, fit = fitted
    assert fit.returncode == 0, fit.stderr[-3000:]
    with open(root / "lightning_logs" / "version_0" / "metrics.csv") as file:
        accuracies = [float(row["val_acc"]) for row in csv.DictReader(file) if row.get("val_acc")]
    assert len(accuracies) == 10 and accuracies[-1] > 0.9 and accuracies[-1] > accuracies[0]
    assert re.search(r"fit ended \(10 epochs, \d+ steps\)", fit.stderr)


def test_the_last_checkpoint_scores_the_test_set(fitted):
    root, _ = fitted
    tested = run(root, "test", "--ckpt_path=last", "--trainer.enable_progress_bar=false")
    assert tested.returncode == 0, tested.stderr[-3000:]
    accuracy = float(re.search(r"test_acc\s*[│|]?\s*([0-9.]+)", tested.stdout + tested.stderr)[1])
    assert accuracy > 0.9
