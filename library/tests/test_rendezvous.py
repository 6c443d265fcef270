"""The start-up rendezvous (trainfleet/runtime/rendezvous.py) without a launch: what a rank measures when node 0's
port is held by another program, or a node never comes."""

import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from trainfleet.exit_codes import CRASHED_EXIT_CODE, REFUSED_EXIT_CODE
from trainfleet.runtime import rendezvous


def member(rank: int) -> rendezvous.Member:
    return rendezvous.Member(rank=rank, world=2, node_rank=rank, local_rank=0, nodes=2, facts=rendezvous.run_facts())


# A node other than 0 meeting at PORT with a 2-second start-up timeout, in a process of its own: the store client it
# gives up on stays blocked in a thread until the process ends.
OTHER_NODE = """
import sys
from datetime import timedelta
from trainfleet.runtime import rendezvous
member = rendezvous.Member(rank=1, world=2, node_rank=1, local_rank=0, nodes=2)
try:
    rendezvous.meet("127.0.0.1", int(sys.argv[1]), member, timedelta(seconds=2))
except rendezvous.StartupFailed as error:
    print(error)
    sys.exit(error.exit_code)
"""


@pytest.mark.slow
def test_a_port_another_program_holds_ends_the_other_nodes_within_the_timeout():
    """torch's store client waits for the store's handshake with no timeout: forever, against a program that
    accepts connections and never answers."""
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        port = other_program.getsockname()[1]
        start = time.monotonic()
        ended = subprocess.run(
            [sys.executable, "-c", OTHER_NODE, str(port)], capture_output=True, text=True, timeout=60, check=False
        )
        seconds = time.monotonic() - start
    assert ended.returncode == REFUSED_EXIT_CODE, ended.stderr[-3000:]
    assert f"MASTER_PORT {port} accepts connections but never answered as the run's rendezvous" in ended.stdout
    assert seconds < 30  # the 2-second timeout, plus importing torch


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
