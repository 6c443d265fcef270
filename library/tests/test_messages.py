"""What the template tells the user (trainfleet/messages.py): ranks share one stderr, and each line stays whole."""

import subprocess
import sys

import pytest
from helpers import REPO, project_env

pytestmark = pytest.mark.slow  # starts processes

LINES = 2000
WRITER = f"""
import sys
from trainfleet.messages import report
for n in range({LINES}):
    report(f"rank {{sys.argv[1]}} line {{n}}: " + "x" * 60)
"""


def test_lines_that_two_processes_report_at_once_to_one_pipe_stay_whole():
    """The way two ranks of a run write to the launcher's stderr (unbuffered, as under PYTHONUNBUFFERED=1)."""
    command = " & ".join(f"{sys.executable} -c '{WRITER}' {rank}" for rank in (0, 1)) + " & wait"
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=project_env(), capture_output=True, text=True, timeout=120
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 2 * LINES
    broken = [line for line in lines if not (line.startswith("[trainfleet] rank ") and line.endswith("x" * 60))]
    assert broken == [], broken[:3]
