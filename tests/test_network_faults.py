"""The network faults of real clusters, on hosts with network stacks of their own (tests/multi_host.py): each ends every
rank within the start-up timeout, naming what was measured and the fix (docs/multi-node.md's troubleshooting table).
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, free_port, project_env, quick_args
from multi_host import Hosts

pytestmark = pytest.mark.slow

STARTUP_S = 6  # the start-up timeout these runs are given (the default is a minute)
# Each process imports torch and Lightning before it starts to wait (seconds here, more on a busy machine).
START_SLACK_S = 40


def fit_argv(run_dir: Path, nodes: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "project",
        "fit",
        *quick_args(run_dir, "--trainer.max_epochs", "1", *extra),
        "--trainer.num_nodes",
        str(nodes),
        "--trainer.devices",
        "1",
        "--trainer.strategy.init_args.startup_timeout",
        f"0:00:{STARTUP_S:02d}",
    ]


def doctor_argv(nodes: int) -> list[str]:
    return [sys.executable, "-m", "project", "doctor", "--num-nodes", str(nodes), "--timeout", str(STARTUP_S)]


def run_on_hosts(hosts: Hosts, runs: list[tuple[int, list[str], dict[str, str]]]) -> list[tuple[int, str, float]]:
    """Starts each (host, argv, env) at once; returns each one's exit code, output and seconds to its end."""
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            hosts[host].command(argv), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for host, argv, env in runs
    ]
    results = []
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=STARTUP_S + START_SLACK_S + 30)  # a hang fails here
            results.append((proc.returncode, output, time.monotonic() - start))
    finally:
        for proc in procs:
            proc.kill()
    return results


def node_env(node_rank: int, address: str, port: int) -> dict[str, str]:
    env = project_env(NODE_RANK=str(node_rank), MASTER_ADDR=address, MASTER_PORT=str(port))
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        env.pop(variable, None)
    return env


def assert_ended(result: tuple[int, str, float], code: int, *words: str) -> None:
    """Exit CODE within the bound, the message (every one of WORDS) on one line, no traceback."""
    returncode, output, seconds = result
    assert returncode == code, output[-3000:]
    assert seconds < STARTUP_S + START_SLACK_S, f"took {seconds:.0f} s:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if words[0] in line]
    for word in words:
        assert word in line, line


@pytest.fixture
def firewall(hosts):
    yield hosts[0].firewall
    hosts[0].clear_firewall()


def test_master_addr_with_no_route_ends_both_nodes_and_leaves_no_run_folder(hosts, tmp_path):
    port = free_port()
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, "10.99.0.1", port)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(hosts, runs)
    assert_ended(node1, 1, "could not reach the rendezvous at MASTER_ADDR 10.99.0.1", "no route to it")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined", "not an address of this host")
    assert not (tmp_path / "run").exists() or not any(path.is_file() for path in (tmp_path / "run").rglob("*"))


def test_a_host_that_is_down_is_named_by_doctor(hosts):
    [node1] = run_on_hosts(hosts, [(1, doctor_argv(2), node_env(1, "10.55.0.9", free_port()))])
    assert_ended(node1, 1, "could not reach the rendezvous at MASTER_ADDR 10.55.0.9", "No route to host")


def test_a_firewall_dropping_the_rendezvous_port(hosts, firewall, tmp_path):
    port = free_port()
    firewall(
        f'chain input {{ type filter hook input priority 0; policy accept; iifname != "lo" tcp dport {port} drop; }}'
    )
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, hosts[0].address, port)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(hosts, runs)
    assert_ended(node1, 1, "could not reach the rendezvous", "no answer", f"open TCP port {port} on node 0")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined")


def test_a_firewall_that_lets_only_the_rendezvous_through(hosts, firewall, tmp_path):
    port = free_port()
    firewall(
        'chain input { type filter hook input priority 0; policy accept; iifname "lo" accept;'
        f" ct state established,related accept; tcp dport {port} accept; tcp dport 1-65535 drop; }}"
    )
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, hosts[0].address, port)) for rank in (0, 1)]
    for result in run_on_hosts(hosts, runs):  # every node ends with the one node's measurement
        assert_ended(
            result, 1, "reached the rendezvous but not node 0", "the nodes reach each other at MASTER_PORT only"
        )


def test_nodes_with_different_configs_are_refused_naming_the_keys(hosts, tmp_path):
    port = free_port()
    lr = ("--model.optimizer.init_args.lr", "0.2")
    runs = [
        (rank, fit_argv(tmp_path / f"run{rank}", 2, *(lr if rank else ())), node_env(rank, hosts[0].address, port))
        for rank in (0, 1)
    ]
    for result in run_on_hosts(hosts, runs):
        assert_ended(
            result, 2, "runs something else than node 0", "config model.optimizer.init_args.lr: 0.1 there, 0.2 here"
        )


def test_two_nodes_with_one_node_rank_are_refused(hosts):
    port = free_port()
    runs = [(host, doctor_argv(3), node_env(min(host, 1), hosts[0].address, port)) for host in (0, 1, 2)]
    for result in run_on_hosts(hosts, runs):
        assert_ended(result, 2, "two processes started as global rank 1", "NODE_RANK 1 is set on two nodes")


def test_a_node_with_another_master_port_is_named(hosts):
    port = free_port()
    runs = [(rank, doctor_argv(2), node_env(rank, hosts[0].address, port + rank)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(hosts, runs)
    assert_ended(node1, 1, "nothing listens at that port", "the same MASTER_PORT")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined")


def test_doctor_across_three_hosts_prints_each_pair_and_the_bandwidth(hosts):
    port = free_port()
    runs = [
        (rank, doctor_argv(3) + ["--sizes", "1M", "--iters", "3"], node_env(rank, hosts[0].address, port))
        for rank in (0, 1, 2)
    ]
    results = run_on_hosts(hosts, runs)
    assert [code for code, _, _ in results] == [0, 0, 0], results[0][1][-3000:]
    output = results[0][1]
    for rank, host in enumerate(hosts.hosts):
        assert f"[project] network: {host.interface} ({host.address})" in results[rank][1]
        for other in set(range(3)) - {rank}:
            assert f"node {rank} ({host.name}) -> node {other} ({hosts[other].name}, {hosts[other].address}:" in output
    assert "all-reduce check PASSED" in output and "Avg bus bandwidth" in output
