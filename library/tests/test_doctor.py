"""The doctor: reports the setup, checks all-reduce on every rank, times it, and fails fast when a peer is missing."""

import argparse
import subprocess
import sys
import time

import pytest
from fake_cluster import slurm_allocation
from helpers import REPO, finish, free_port, project_env, run_project, start_python

from trainfleet.commands.doctor import parse_size

SMALL = ("--sizes", "4K", "1M", "--iters", "5", "--warmup", "1", "--timeout", "30")


def table(output: str) -> list[dict[str, float]]:
    """The rows of the all-reduce table rank 0 prints (nccl-tests' columns)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "busbw(GB/s)" in line) + 1
    rows = []
    for line in lines[start:]:
        if line.startswith("Avg bus bandwidth"):
            return rows
        size, count, time_us, algbw, busbw, wrong = line.split()
        rows.append(
            {"bytes": int(size), "count": int(count), "time_us": float(time_us), "algbw": float(algbw)}
            | {"busbw": float(busbw), "wrong": int(wrong)}
        )
    raise AssertionError(f"no end of table in:\n{output}")


def assert_bandwidth_reported(output: str, world: int) -> None:
    rows = table(output)
    assert [row["bytes"] for row in rows] == [4096, 2**20]
    assert [row["count"] for row in rows] == [1024, 2**18]
    assert rows[-1]["algbw"] > 0
    for row in rows:
        assert row["wrong"] == 0 and row["time_us"] > 0
        # nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (4 decimals printed)
        assert row["algbw"] == pytest.approx(row["bytes"] / row["time_us"] / 1e3, rel=0.01, abs=2e-4)
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (world - 1) / world, rel=0.01, abs=2e-4)
    assert f"all-reduce check PASSED: every element must equal 1 + ... + {world} = {world * (world + 1) // 2}" in output


@pytest.mark.slow
def test_two_processes_pass_the_check_and_report_bandwidth():
    result = run_project("doctor", "--nprocs", "2", *SMALL, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "launcher:    LightningEnvironment" in result.stdout and "backend:     gloo" in result.stdout
    for rank in (0, 1):
        assert f"rank {rank}/2: local rank {rank}, node rank 0," in result.stdout
    assert_bandwidth_reported(result.stdout, world=2)


@pytest.mark.slow
def test_srun_tasks_get_their_ranks_from_slurm_and_the_debug_switch_reaches_torch():
    env = slurm_allocation(nodes=2, tasks_per_node=2, PROJECT_DIST_DEBUG="1")
    result = subprocess.run(
        ["srun", sys.executable, "-m", "project", "doctor", *SMALL],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for task in range(4):  # srun's block distribution: tasks 0, 1 on node 0 and 2, 3 on node 1
        line = f"rank {task}/4: local rank {task % 2}, node rank {task // 2},"
        assert any(out.startswith(line) and out.endswith("SLURMEnvironment") for out in result.stdout.splitlines())
    # One report per node (local rank 0), each showing the debug settings torch actually uses.
    assert result.stdout.count("NCCL_DEBUG=INFO, TORCH_DISTRIBUTED_DEBUG=DETAIL, debug level DETAIL") == 2
    assert_bandwidth_reported(result.stdout, world=4)


@pytest.mark.slow
def test_missing_or_unreachable_peers_fail_within_the_timeout():
    timeout = 5
    lone_port, nobody_port, short_port = free_port(), free_port(), free_port()
    cases = {
        # node 0 of 2 starts, node 1 never does
        "peer missing": [("0", lone_port, "2")],
        # node 1 of 2 looks for the main node at a port nobody listens on
        "wrong address or port": [("1", nobody_port, "2")],
        # both nodes come, but each was told there are 3
        "world size too large": [("0", short_port, "3"), ("1", short_port, "3")],
    }
    runs = []
    start = time.monotonic()
    for case, nodes in cases.items():
        for node_rank, port, num_nodes in nodes:
            env = project_env(NODE_RANK=node_rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            args = ("doctor", "--num-nodes", num_nodes, "--timeout", str(timeout))
            runs.append((case, start_python("-m", "project", *args, cwd=REPO, env=env)))
    measured = {  # what each process measured (runtime/rendezvous.py), not a list of guesses
        "peer missing": "node rank 1 (rank 1 of 2 missing) never joined the rendezvous",
        "wrong address or port": "nothing listens at that port (connection refused)",
        "world size too large": "node rank 2 (rank 2 of 3 missing) never joined the rendezvous",
    }
    for case, run in runs:
        result = finish(run, timeout=90)  # a hang fails here
        assert result.returncode == 1, f"{case}: {result.stderr[-2000:]}"
        assert measured[case] in result.stderr and "Traceback" not in result.stderr, f"{case}: {result.stderr[-2000:]}"
    assert time.monotonic() - start >= timeout  # they waited for the peers before giving up


@pytest.mark.slow
def test_single_process_reports_and_says_how_to_launch_distributed():
    result = run_project("doctor", cwd=REPO, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "versions:    python" in result.stdout and "rank 0/1:" in result.stdout
    assert "no all-reduce check" in result.stdout and "torchrun --standalone" in result.stdout


def test_sizes_take_binary_units():
    assert [parse_size(text) for text in ("4096", "64K", "16m", "1G")] == [4096, 2**16, 2**24, 2**30]
    for bad in ("3", "lots", "1T"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)
