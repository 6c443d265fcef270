"""The network faults of real clusters, on hosts with network stacks of their own (tests/multi_host.py): each ends every
rank within the start-up timeout, naming what was measured and the fix (docs/multi-node.md's troubleshooting table).
"""

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, free_port, project_env, quick_args
from multi_host import Hosts
from warm_start import SERVER, WarmServer

pytestmark = pytest.mark.slow

STARTUP_S = 6  # the start-up timeout these runs are given (the default is a minute)
# Each process is forked from a warm server on its host (``servers``), but a busy machine still takes its time.
START_SLACK_S = 40


def fit_argv(run_dir: Path, nodes: int, *extra: str) -> list[str]:
    return [
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
    return ["-m", "project", "doctor", "--num-nodes", str(nodes), "--timeout", str(STARTUP_S)]


@pytest.fixture(scope="module")
def servers(hosts: Hosts) -> Iterator[list[WarmServer]]:
    """A warm-start server on each host (tests/warm_start.py): each run is forked there, in the host's namespaces,
    without an interpreter's seconds of imports (about 20 processes in this file)."""
    started = [WarmServer(project_env(), host.command([sys.executable, str(SERVER)])) for host in hosts.hosts]
    for server in started:
        server.ready()  # the first test's bound is not the servers' imports (40 s on a busy machine in a CI run)
    yield started
    for server in started:
        server.close()


def run_on_hosts(
    servers: list[WarmServer], runs: list[tuple[int, list[str], dict[str, str]]]
) -> list[tuple[int, str, float]]:
    """Starts each (host, python's argv, env) at once; returns each one's exit code, output and seconds to its end."""
    start = time.monotonic()
    started = [
        servers[host].start(argv, REPO, env, Path(tempfile.mkdtemp(prefix="run-output-"))) for host, argv, env in runs
    ]
    results = []
    try:
        for run in started:
            returncode = run.wait(timeout=STARTUP_S + START_SLACK_S + 30)  # a hang fails here
            results.append((returncode, run.stdout.read_text() + run.stderr.read_text(), time.monotonic() - start))
    finally:
        for run in started:
            if run.returncode is None:
                run.kill()
            shutil.rmtree(run.stdout.parent)
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


def test_master_addr_with_no_route_ends_both_nodes_and_leaves_no_run_folder(servers, tmp_path):
    port = free_port()
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, "10.99.0.1", port)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(servers, runs)
    assert_ended(node1, 1, "could not reach the rendezvous at MASTER_ADDR 10.99.0.1", "no route to it")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined", "not an address of this host")
    assert not (tmp_path / "run").exists() or not any(path.is_file() for path in (tmp_path / "run").rglob("*"))


def test_a_host_that_is_down_is_named_by_doctor(servers):
    [node1] = run_on_hosts(servers, [(1, doctor_argv(2), node_env(1, "10.55.0.9", free_port()))])
    assert_ended(node1, 1, "could not reach the rendezvous at MASTER_ADDR 10.55.0.9", "No route to host")


def test_a_firewall_dropping_the_rendezvous_port(servers, hosts, firewall, tmp_path):
    port = free_port()
    firewall(
        f'chain input {{ type filter hook input priority 0; policy accept; iifname != "lo" tcp dport {port} drop; }}'
    )
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, hosts[0].address, port)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(servers, runs)
    assert_ended(node1, 1, "could not reach the rendezvous", "no answer", f"open TCP port {port} on node 0")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined")


def test_a_firewall_that_lets_only_the_rendezvous_through(servers, hosts, firewall, tmp_path):
    port = free_port()
    firewall(
        'chain input { type filter hook input priority 0; policy accept; iifname "lo" accept;'
        f" ct state established,related accept; tcp dport {port} accept; tcp dport 1-65535 drop; }}"
    )
    runs = [(rank, fit_argv(tmp_path / "run", 2), node_env(rank, hosts[0].address, port)) for rank in (0, 1)]
    for result in run_on_hosts(servers, runs):  # every node ends with the one node's measurement
        assert_ended(
            result, 1, "reached the rendezvous but not node 0", "the nodes reach each other at MASTER_PORT only"
        )


def test_nodes_with_different_configs_are_refused_naming_the_keys(servers, hosts, tmp_path):
    port = free_port()
    lr = ("--model.optimizer.init_args.lr", "0.2")
    runs = [
        (rank, fit_argv(tmp_path / f"run{rank}", 2, *(lr if rank else ())), node_env(rank, hosts[0].address, port))
        for rank in (0, 1)
    ]
    for result in run_on_hosts(servers, runs):
        assert_ended(
            result, 2, "runs something else than node 0", "config model.optimizer.init_args.lr: 0.1 there, 0.2 here"
        )


def test_two_nodes_with_one_node_rank_are_refused(servers, hosts):
    port = free_port()
    runs = [(host, doctor_argv(3), node_env(min(host, 1), hosts[0].address, port)) for host in (0, 1, 2)]
    for result in run_on_hosts(servers, runs):
        assert_ended(result, 2, "two processes started as global rank 1", "NODE_RANK 1 is set on two nodes")


def test_a_node_with_another_master_port_is_named(servers, hosts):
    port = free_port()
    runs = [(rank, doctor_argv(2), node_env(rank, hosts[0].address, port + rank)) for rank in (0, 1)]
    node0, node1 = run_on_hosts(servers, runs)
    assert_ended(node1, 1, "nothing listens at that port", "the same MASTER_PORT")
    assert_ended(node0, 1, "node rank 1 (rank 1 of 2 missing) never joined")


def test_doctor_across_three_hosts_prints_each_pair_and_the_bandwidth(servers, hosts):
    port = free_port()
    runs = [
        (rank, doctor_argv(3) + ["--sizes", "1M", "--iters", "3"], node_env(rank, hosts[0].address, port))
        for rank in (0, 1, 2)
    ]
    results = run_on_hosts(servers, runs)
    assert [code for code, _, _ in results] == [0, 0, 0], results[0][1][-3000:]
    output = results[0][1]
    for rank, host in enumerate(hosts.hosts):
        assert f"[project] network: {host.interface} ({host.address})" in results[rank][1]
        for other in set(range(3)) - {rank}:
            assert f"node {rank} ({host.name}) -> node {other} ({hosts[other].name}, {hosts[other].address}:" in output
    assert "all-reduce check PASSED" in output and "Avg bus bandwidth" in output
