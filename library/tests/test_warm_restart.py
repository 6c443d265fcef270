"""The warm restarts' decisions (trainfleet/runtime/warm_restart.py), in this process: which runs are supervised, and
which cause of an attempt's failure every supervisor reports. The restarts themselves run in tests/test_faults.py
(scripts/torchrun.sh: a rank killed, then hung) and tests/test_slurm.py (the chaos job)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from helpers import LIBRARY, REPO

from trainfleet.checkpoints import writing
from trainfleet.runtime import warm_restart
from trainfleet.runtime.warm_restart import Supervisor

TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "RANK": "1", "LOCAL_RANK": "1"}
SRUN = {"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "project"}


def supervisor(rank: int) -> tuple[Supervisor, dist.Store]:
    store = dist.HashStore()
    supervising = Supervisor(store, budget=3)
    supervising.rank = rank
    return supervising, store


@pytest.mark.parametrize(
    ("argv", "env", "supervised"),
    [
        (["fit", "--config", "x.yaml"], {**TORCHRUN, "PROJECT_WARM_RESTARTS": "3"}, True),
        (["fit"], {**SRUN, "PROJECT_WARM_RESTARTS": "0"}, True),
        (["fit"], {**TORCHRUN}, False),  # no budget: torchrun's own restarts, if any
        (["fit"], {"PROJECT_WARM_RESTARTS": "3"}, False),  # not launched: Lightning's launcher or one process
        (["validate"], {**TORCHRUN, "PROJECT_WARM_RESTARTS": "3"}, False),
        (["fit"], {**SRUN, "PROJECT_WARM_RESTARTS": "three"}, False),
    ],
    ids=["torchrun", "srun", "no-budget", "not-launched", "not-fit", "not-a-number"],
)
@pytest.mark.filterwarnings("ignore:The `srun` command is available")  # Lightning's, on a machine with SLURM
def test_only_fit_started_by_torchrun_or_srun_with_a_budget_is_supervised(monkeypatch, argv, env, supervised):
    for name in (*TORCHRUN, *SRUN, "PROJECT_WARM_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert warm_restart.requested(argv) is supervised


def test_the_first_cause_said_of_an_attempt_stands():
    store = dist.HashStore()
    first = "rank 0/2 failed at step 5: RuntimeError: boom"
    assert warm_restart._failed(store, 0, first) == first
    assert warm_restart._failed(store, 0, "rank 1 exited with code 1") == first
    assert warm_restart._failed(store, 1, "rank 1 exited with code 1") == "rank 1 exited with code 1"  # its own


def test_a_rank_killed_from_outside_is_the_cause_over_its_peers_dropped_connections():
    killed, store = supervisor(rank=1)
    warm_restart._failed(store, 0, "rank 0/2 failed at step 43: RuntimeError: Connection reset by peer")
    assert killed._cause(0, -signal.SIGKILL) == "rank 1 was killed by SIGKILL"
    assert warm_restart._failed(store, 0, "rank 0 exited with code 1") == "rank 1 was killed by SIGKILL"


def test_a_rank_its_peer_named_as_hung_and_killed_keeps_the_peers_cause():
    hung, store = supervisor(rank=1)
    named = "rank 1 stopped: its last heartbeat was at step 94, 11 s ago (rank 0/2 failed at step 102: ...)"
    warm_restart._failed(store, 0, named)
    assert hung._cause(0, -signal.SIGKILL) == named


def test_a_rank_its_supervisor_killed_after_a_peer_failed_is_not_the_cause():
    waiting, store = supervisor(rank=0)
    warm_restart._failed(store, 0, "rank 1 was killed by SIGKILL")
    assert waiting._cause(0, -signal.SIGKILL, killed_here=True) == "rank 1 was killed by SIGKILL"


def test_a_supervisor_ends_with_its_ranks_code_or_128_plus_the_signal_that_ended_it():
    assert [warm_restart._status(code) for code in (0, 1, 143, -signal.SIGKILL)] == [0, 1, 143, 137]


def test_a_rank_that_exits_first_says_so():
    failed, _ = supervisor(rank=0)
    assert failed._cause(2, 1) == "rank 0 exited with code 1"


def test_a_rank_without_supervisor_says_nothing(monkeypatch):
    monkeypatch.delenv("PROJECT_WARM_RESTARTS", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")  # would time out if it tried to reach it
    monkeypatch.setenv("MASTER_PORT", "9")
    warm_restart.say_failed("rank 0/1 failed at step 1: RuntimeError: boom")


def writing_rank(seconds: float) -> int:
    """A forked rank that writes a checkpoint for SECONDS (``checkpoints/writing.py``'s mark), then waits in a
    collective that will never complete (as a peer of a failed rank does)."""
    pid = os.fork()
    if pid == 0:
        with writing.writing():
            time.sleep(seconds)
        time.sleep(60)
        os._exit(0)
    return pid


@pytest.mark.slow
@pytest.mark.parametrize(
    ("save_grace", "ended_within", "said"),
    [
        (30.0, (3.0, 6.0), "rank 0: finishing the checkpoint it writes before it ends"),
        (0.5, (0.5, 2.5), "rank 0: killed while writing a checkpoint"),
    ],
)
def test_a_rank_writing_a_checkpoint_after_a_failure_finishes_it_before_its_supervisor_ends_it(
    monkeypatch, capsys, save_grace, ended_within, said
):
    """A peer's failure is written at once; the rank still writes for 3 s, then hangs: its supervisor waits for the
    write (the failed rank's own background save) and ends the rank after it, or, past the save's grace, ends it
    mid-write and says the previous checkpoint stands."""
    monkeypatch.setattr(warm_restart, "GRACE_S", 0.2)
    monkeypatch.setattr(warm_restart, "SAVE_GRACE_S", save_grace)
    watching, store = supervisor(rank=0)
    warm_restart._failed(store, 0, "rank 1 exited with code 1")
    start = time.monotonic()
    assert watching._watch(writing_rank(3.0), 0) == (-signal.SIGKILL, True)
    assert ended_within[0] <= time.monotonic() - start < ended_within[1]
    assert said in capsys.readouterr().err


def test_a_supervisor_waits_in_the_store_for_a_failure_instead_of_polling_it():
    watching, store = supervisor(rank=0)
    seen = watching._failure_seen(4)
    assert not seen.wait(0.3)
    warm_restart._failed(store, 4, "rank 1 exited with code 1")
    assert seen.wait(5)


@pytest.mark.slow
def test_a_supervisor_makes_no_cuda_call_before_it_forks_its_rank():
    """The GPU check's own probe (scripts/gpu_check.py), here on a CUDA build of torch without a device: every CUDA
    entry point's calls counted, none made by what the supervisor runs before its fork."""
    sys.path.insert(0, str(LIBRARY / "scripts"))
    try:
        from gpu_check import CUDA_BEFORE_FORK
    finally:
        sys.path.remove(str(LIBRARY / "scripts"))
    done = subprocess.run([sys.executable, "-c", CUDA_BEFORE_FORK], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"calls": [], "initialized": False}
