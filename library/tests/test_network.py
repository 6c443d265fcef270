"""The interface a multi-node run talks on (trainfleet/runtime/network.py), on this machine's own interfaces: the one
on the route to MASTER_ADDR, another where that is loopback by a name, and a named one that does not exist refused."""

import sys

import pytest
from helpers import quick_args
from test_cli_errors import _refused

from trainfleet.runtime import network


@pytest.fixture(autouse=True)
def no_interface_named(monkeypatch):
    for variable in network.INTERFACE_VARS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(sys, "argv", ["project"])


def test_the_interface_on_the_route_to_master_addr_is_named_for_both_backends():
    environ: dict[str, str] = {}
    line = network.choose_interface(environ, "127.0.0.1", 29500)
    assert line.startswith("network: lo (127.0.0.1), the interface on the route to MASTER_ADDR 127.0.0.1")
    assert environ == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert network.choose_interface(environ := {}, "127.0.0.1", 29500, pick=False) is None and environ == {}


def test_a_name_that_resolves_to_loopback_on_node_0_gets_the_interface_the_others_reach(monkeypatch):
    """On node 0, MASTER_ADDR names this host and its name resolves to 127.0.0.1 (cloud images): lo would tell the
    other nodes to connect to themselves."""
    loopback = network.Interface("lo", "127.0.0.1")
    monkeypatch.setattr(network, "route_interface", lambda host, port: loopback if host == "node0" else outward)
    outward = network.Interface("ens5", "10.55.0.1")
    environ: dict[str, str] = {}
    line = network.choose_interface(environ, "node0", 29500)
    assert line.startswith("network: ens5 (10.55.0.1), the interface on the default route (MASTER_ADDR node0 is")
    assert environ["GLOO_SOCKET_IFNAME"] == "ens5"
    # No default route either (the test hosts): the first interface no container or loopback owns.
    outward = loopback
    interfaces = [loopback, network.Interface("docker0", "172.17.0.1"), network.Interface("enp2s0", "10.55.0.2")]
    monkeypatch.setattr(network, "interfaces", lambda: interfaces)
    line = network.choose_interface(environ := {}, "node0", 29500)
    assert line.startswith("network: enp2s0 (10.55.0.2), the first interface that is not loopback or a container's")


@pytest.mark.parametrize("variable", network.INTERFACE_VARS)
def test_a_named_interface_that_does_not_exist_is_refused_before_start(capsys, monkeypatch, tmp_path, variable):
    monkeypatch.setenv(variable, "=ib9" if variable == "NCCL_SOCKET_IFNAME" else "ib9")
    args = quick_args(tmp_path / "run", "--trainer.devices", "2")
    stderr = _refused(capsys, tmp_path / "run", "fit", *args)
    assert f"{variable}=" in stderr and "this host has no interface 'ib9'; it has lo (127.0.0.1)" in stderr
