"""Many nodes: the run's coordination (runtime/rendezvous.py, runtime/faults.py's heartbeat, runtime/warm_restart.py's
supervisors) at 80 and 256 simulated nodes, through ``python -m benchmarks.scale`` (threads of one process, in a
network namespace of its own: the benchmark says why), its real code paths and its figures.

Until the start-up probed a ring of neighbours, every node connected to every other node's listener, which never
accepted: from 67 nodes on, every node failed with "no answer", blaming the network."""

import json
import shutil
import subprocess
import sys

import pytest
from helpers import LIBRARY, REPO, project_env

from trainfleet.runtime import rendezvous


@pytest.fixture(scope="module")
def scale(tmp_path_factory):
    """One run of the benchmark at 80 and 256 nodes, and 128 with one node firewalled: its figures."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"]).returncode:
        pytest.skip("needs a network namespace of its own (root): see benchmarks/scale.py's own_network")
    output = tmp_path_factory.mktemp("scale") / "scale"
    argv = "--nodes 80 256 --seconds 4 --firewall 128 --torch-timeout 0 --processes-up-to 0 --agreement-up-to 0"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", *argv.split(), "--output", str(output)],
        cwd=LIBRARY,
        env=project_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert output.with_suffix(".png").stat().st_size > 10_000  # the plot, beside the table
    return json.loads(output.with_suffix(".json").read_text())


@pytest.mark.slow
def test_80_nodes_meet_where_a_full_mesh_of_probes_failed_every_node(scale):
    startup = scale["threads"][0]
    assert (startup["nodes"], startup["met"], startup["failure"]) == (80, 80, "")


@pytest.mark.slow
def test_256_nodes_meet_quickly_with_a_few_connections_each(scale):
    startup = scale["threads"][1]
    assert (startup["nodes"], startup["met"]) == (256, 256)
    assert startup["seconds"] < 20  # 0.35 s here (1,024 nodes: 2.2 s)
    assert startup["connections_per_node"] <= 4  # the store (checked, then kept), one probe out, one in


@pytest.mark.slow
def test_while_training_each_node_asks_the_store_at_most_once_a_second(scale):
    training = scale["training"][1]
    assert training["nodes"] == 256
    assert 0 < training["requests_per_node_s"] <= 1.0  # heartbeats only: the supervisors wait, they do not poll


@pytest.mark.slow
def test_one_failure_is_known_to_every_node_within_seconds(scale):
    training = scale["training"][1]
    assert training["failure_woke_all_s"] < 5
    assert training["beats_read_by_all_s"] < 10  # every node reading every beat once, in two requests


@pytest.mark.slow
def test_the_preemption_agreement_is_measured_on_gloo_among_4_ranks(monkeypatch):
    monkeypatch.syspath_prepend(str(LIBRARY))
    from benchmarks import scale

    assert 0 < scale.measure_agreement(4, rounds=3) < 5  # seconds: gloo's all-reduce of a flag per rank


@pytest.mark.slow
def test_the_node_behind_a_firewall_is_named_by_its_neighbour_not_node_0(scale):
    assert "node 64 (" in scale["firewall"] and "reached the rendezvous but not node 65 (" in scale["firewall"]


@pytest.mark.parametrize("nodes", [1, 2, 3, 80, 1024])
def test_every_node_is_probed_by_one_neighbour_and_probes_one(nodes):
    probes = [rendezvous.neighbours(node, nodes) for node in range(nodes)]
    assert all(len(targets) == min(rendezvous.PROBES_PER_NODE, nodes - 1) for targets in probes)
    probed = sorted(target for targets in probes for target in targets)
    assert probed == ([] if nodes == 1 else sorted(range(nodes)) * rendezvous.PROBES_PER_NODE)
