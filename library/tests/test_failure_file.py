"""A crash once training started fits on one screen: FailFast's `[project]` line, then one line with the file that
holds the whole traceback (runs/failures.py) and the traceback's last lines."""

import os
import re
import sys

import pytest
from helpers import LIBRARY, REPO, project_env, quick_args, run_folder, run_project

from trainfleet.runs import failures

TESTS = str(LIBRARY / "tests")
SCREEN = 30  # stderr lines of a 2-process run that fails at step 3: start-up banners, each rank's 7 lines
TRACEBACK = "Traceback (most recent call last)"


@pytest.mark.slow
def test_a_rank_that_crashes_after_training_started_prints_its_tracebacks_file_and_last_lines(tmp_path):
    """Before, each rank's whole traceback followed its line: 38 lines from rank 1, 99 from rank 0 (its collective
    failed when rank 1 ended). A checkpoint at step 2 gives the run something to keep."""
    fail = ("--trainer.callbacks+=fault_injection.FailAt", "--trainer.callbacks.step", "3")
    fail += ("--trainer.callbacks.rank", "1", "--checkpoint.every_n_train_steps", "2")
    args = quick_args(tmp_path, "--trainer.devices", "2", "--trainer.max_epochs", "1", *fail)
    result = run_project("fit", *args, cwd=REPO, env=project_env(PYTHONPATH=TESTS))
    assert result.returncode != 0
    failed = "[project] rank 1/2 failed at step 3: RuntimeError: injected failure on rank 1 at step 3"
    assert failed in result.stderr
    folder = run_folder(tmp_path, 0)
    pointer = r"\[project\] rank 1: its traceback \((\d+) lines\) is in (\S+); its last 5 lines:"
    said = re.search(pointer, result.stderr)
    assert said and said.group(2) == str(folder / "failure-rank1.txt"), result.stderr[-3000:]
    saved = (folder / "failure-rank1.txt").read_text()
    assert TRACEBACK in saved and "fault_injection.py" in saved and saved.count("\n") == int(said.group(1)) + 1
    excerpt = result.stderr[said.end() :].splitlines()[1:6]
    assert excerpt[-1] == "RuntimeError: injected failure on rank 1 at step 3" and excerpt == saved.splitlines()[-5:]
    assert TRACEBACK not in result.stderr and len(result.stderr.splitlines()) <= SCREEN, result.stderr


def crash() -> tuple:
    try:
        raise ValueError("the error")
    except ValueError:
        return sys.exc_info()


def test_before_training_started_the_traceback_is_printed_whole(capsys, monkeypatch):
    monkeypatch.setattr(failures, "_where", None)
    failures.report_crash(*crash())
    printed = capsys.readouterr().err
    assert TRACEBACK in printed and "ValueError: the error" in printed and "[project]" not in printed


def test_a_run_folder_with_nothing_to_keep_gets_no_traceback_a_temporary_file_does(tmp_path, capsys):
    """A new run that failed before its first checkpoint or metric leaves no folder (RunRecord removes it, maybe while
    another rank writes there): its tracebacks go to a temporary file, which the line names."""
    (tmp_path / "config.yaml").write_text("")
    failures.report_crash(*crash(), where=tmp_path / "failure-rank0.txt")
    printed = capsys.readouterr().err.splitlines()
    path = re.search(r"is in (\S+); its last 4 lines:", printed[0]).group(1)  # the whole of a 4-line traceback
    assert not (tmp_path / "failure-rank0.txt").exists() and not path.startswith(str(tmp_path))
    with open(path) as file:
        assert "ValueError: the error" in file.read()
    os.unlink(path)
    assert printed[1:] == [TRACEBACK + ":", *printed[2:4], "ValueError: the error"] and len(printed) == 5
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")  # now the folder is a run to keep
    failures.report_crash(*crash(), where=tmp_path / "failure-rank0.txt")
    assert f"is in {tmp_path / 'failure-rank0.txt'};" in capsys.readouterr().err
