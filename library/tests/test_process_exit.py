"""How a rank's process ends (trainfleet/runtime/process_exit.py): after a process group, without the interpreter's
finalization, still with the status, the atexit handlers and everything printed."""

import subprocess
import sys

import pytest
from helpers import REPO, free_port, project_env

pytestmark = pytest.mark.slow  # starts a process

# One process with a gloo group and DDP on it, as a rank of a run has, ended by process_exit.end.
RANK = """
import atexit, os, torch
import torch.distributed as dist
from trainfleet.runtime import process_exit
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
process_exit.destroy_process_group()
threads = {{open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")}}
print("threads after destroy_process_group:", *sorted(threads))
atexit.register(print, "atexit handler ran")
print("printed into the buffer")  # stdout is a pipe: block-buffered
process_exit.end(SystemExit({code}))
"""


def end_a_rank(code: str) -> subprocess.CompletedProcess:
    script, env = RANK.format(port=free_port(), code=code), project_env()
    del env["PYTHONUNBUFFERED"]
    command = [sys.executable, "-c", script]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_gloo_threads_outlive_the_group_so_the_process_ends_without_finalizing_yet_as_sys_exit_would():
    result = end_a_rank("3")
    assert result.returncode == 3, result.stderr
    # The reason for the early exit: the day torch joins these threads in destroy_process_group, it can go.
    assert "pt_gloo_runloop" in result.stdout.splitlines()[0], result.stdout
    assert result.stdout.splitlines()[1:] == ["printed into the buffer", "atexit handler ran"]


def test_an_exit_with_a_message_prints_it_and_ends_with_status_1():
    result = end_a_rank("'error: the run failed'")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: the run failed"
