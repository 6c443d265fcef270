"""The README's main command prints no warning, on 1 and 2 processes, and its progress bar shows what a user reads."""

import re

import pytest
from conftest import DIGITS_CONFIG, REPO, exec_project

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
    assert "v_num" not in output and "train_loss" in output and "val_acc" in output
    assert re.search(r"samples_per_sec:\s+[\d,]+\s", output)  # a whole number, with thousands separators
