"""The fast subset (`pytest -m "not slow"`) stays fast: a test without the slow mark cannot start a process."""

import multiprocessing
import subprocess
import sys

import pytest


def test_a_test_not_marked_slow_cannot_start_a_process_but_may_ask_git():
    with pytest.raises(RuntimeError, match="test_fast_subset.py::.* starts a process: mark it slow"):
        subprocess.run([sys.executable, "-m", "project", "--help"], capture_output=True)
    with pytest.raises(RuntimeError, match="starts a process"):
        subprocess.run(["bash", "-c", "true"])
    with pytest.raises(RuntimeError, match="starts a process"):
        multiprocessing.get_context("fork").Process(target=print).start()
    assert subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.startswith("git version")


@pytest.mark.slow
def test_a_slow_test_starts_processes():
    assert subprocess.run([sys.executable, "-c", "import sys; sys.exit(3)"]).returncode == 3
    assert subprocess.run(["bash", "-c", "exit 4"]).returncode == 4
