"""The start-up rendezvous (project/runtime/rendezvous.py) in one process, where no launch is needed: what a rank
measures when node 0's port is held by another program, or a node never comes."""

import socket
import time
from datetime import timedelta

import pytest

from project.exit_codes import CRASHED_EXIT_CODE, REFUSED_EXIT_CODE
from project.runtime import rendezvous


def member(rank: int) -> rendezvous.Member:
    return rendezvous.Member(rank=rank, world=2, node_rank=rank, local_rank=0, nodes=2, facts=rendezvous.run_facts())


def test_a_port_another_program_holds_ends_the_other_nodes_within_the_timeout():
    """torch's store client waits for the store's handshake with no timeout: forever, against a program that
    accepts connections and never answers."""
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        port = other_program.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(rendezvous.StartupFailed) as failed:
            rendezvous.meet("127.0.0.1", port, member(1), timedelta(seconds=2))
    assert 2 <= time.monotonic() - start < 10
    assert failed.value.exit_code == REFUSED_EXIT_CODE
    assert f"MASTER_PORT {port} accepts connections but never answered as the run's rendezvous" in str(failed.value)


def test_node_0_alone_names_the_node_it_waits_for_then_the_one_that_never_came(capsys):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(rendezvous.StartupFailed) as failed:
        rendezvous.meet("127.0.0.1", port, member(0), timedelta(seconds=3))
    assert failed.value.exit_code == CRASHED_EXIT_CODE  # may be transient: a launcher's restart may retry it
    assert str(failed.value).startswith(
        f"node rank 1 (rank 1 of 2 missing) never joined the rendezvous at 127.0.0.1:{port}"
    )
    notice = f"[project] rendezvous at 127.0.0.1:{port}: waiting for node rank 1 (rank 1 of 2 missing)"
    assert capsys.readouterr().err.count(notice) == 1
