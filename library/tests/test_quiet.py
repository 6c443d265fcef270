"""The README's main command prints no warning, on 1 and 2 processes, and its progress bar shows what a user reads."""

import re

import pytest
from helpers import DIGITS_CONFIG, REPO, exec_project, run_project

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

# How Python (and Lightning's rank_zero_warn) print a warning: "path/to/file.py:LINE: [Category: ]message".
WARNING_LINE = re.compile(r"^\S+\.py:\d+: ", re.MULTILINE)


@pytest.mark.parametrize("devices", ["1", "2"])
def test_the_main_command_prints_no_warning(tmp_path, devices):
    flags = ("--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "2", "--trainer.devices", devices)
    result = exec_project("fit", "--config", str(DIGITS_CONFIG), *flags, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert WARNING_LINE.findall(output) == [], output
    assert "Warning" not in output and "warn" not in output.lower()
    assert "Tip" not in output and "litlogger" not in output  # Lightning's advertisement
    assert "v_num" not in output and "train_loss" in output and "val_acc" in output
    # A whole number, with thousands separators (at over 1,000 it/s Rich wraps it below the bar's time column).
    assert re.search(r"samples_per_sec:\s+(?:\d+:\d\d:\d\d\s+)?[\d,]+\s", output)


def test_a_small_table_trains_and_predicts_without_a_warning(tmp_path):
    """Fewer training batches (3) than log_every_n_steps (10), and predictions through the tensor loader: two
    places where Lightning warns unless told otherwise."""
    rows = "".join(f"{i % 7},{i % 5},{'ab'[i % 2]}\n" for i in range(100))
    (tmp_path / "small.csv").write_text("f,g,label\n" + rows)
    table = ("--config", str(REPO / "configs" / "table.yaml"), "--trainer.default_root_dir", str(tmp_path / "run"))
    table += ("--data.init_args.path", str(tmp_path / "small.csv"), "--data.init_args.label", "label")
    fit = run_project("fit", "--config", str(DIGITS_CONFIG), *table, "--trainer.max_epochs", "2", cwd=REPO)
    assert fit.returncode == 0, fit.stderr[-3000:]
    flags = ("--data.init_args.predict_path", str(tmp_path / "small.csv"), "--ckpt_path", "last")
    predict = run_project("predict", "--config", str(DIGITS_CONFIG), *table, *flags, cwd=REPO)
    assert predict.returncode == 0, predict.stderr[-3000:]
    output = fit.stdout + fit.stderr + predict.stdout + predict.stderr
    assert "100 predictions written" in output
    assert WARNING_LINE.findall(output) == [] and "warn" not in output.lower() and "Tip" not in output, output
