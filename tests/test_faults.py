"""Real DDP runs (2 CPU processes, gloo) that fail: no hang, no orphan, the failed rank named, nothing lost.

Failures are injected by ``fault_injection.FailAt`` (tests/ is put on the children's PYTHONPATH).
"""

import re
import socket
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, last_checkpoint, project_env, quick_args, run_project

TESTS = str(REPO / "tests")


def fit(run_dir: Path, *extra: str, timeout: float = 120):
    """`fit` on 2 processes; returns the finished process and the seconds until every process had exited.

    stderr is a pipe every rank inherits, so the run returns only when the last rank has closed it.
    """
    start = time.monotonic()
    args = quick_args(run_dir, "--trainer.devices", "2", *extra)
    result = run_project("fit", *args, cwd=REPO, env=project_env(PYTHONPATH=TESTS), timeout=timeout)
    return result, time.monotonic() - start


def fail_at(step: int, rank: int, action: str) -> list[str]:
    return [
        "--trainer.callbacks+=fault_injection.FailAt",
        *("--trainer.callbacks.step", str(step), "--trainer.callbacks.rank", str(rank)),
        *("--trainer.callbacks.action", action),
    ]


def processes_running_in(run_dir: Path) -> list[int]:
    """Live processes whose command line names RUN_DIR: the run's ranks, if any are left."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_dir).encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


@pytest.mark.parametrize(
    ("rank", "action", "named"),
    [
        (1, "raise", "rank 1/2 failed at step 3: RuntimeError: injected failure on rank 1"),
        (1, "sigkill", "was killed by SIGKILL"),
        (0, "sigkill", "rank 0, the process that launched rank 1, is gone"),
    ],
    ids=["rank1-raises", "rank1-killed", "rank0-killed"],
)
def test_a_failed_rank_ends_every_process_quickly_and_is_named(tmp_path, rank, action, named):
    result, seconds = fit(tmp_path / "run", *fail_at(3, rank, action), "--trainer.max_epochs", "1")
    assert result.returncode != 0
    assert named in result.stderr
    if action == "sigkill" and rank == 1:
        assert re.search(r"rank 1 \(pid \d+\) was killed by SIGKILL", result.stderr)
    assert seconds < 60  # start-up included: a hang would wait for the 30-minute collective timeout
    assert processes_running_in(tmp_path / "run") == []


def test_a_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    result, _ = fit(tmp_path, "--model.optimizer.init_args.lr", "1000", "--trainer.max_epochs", "3")
    assert result.returncode != 0
    found = re.search(r"the training loss became NaN or inf at step (\d+)", result.stderr)
    assert found, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert 0 < ckpt["global_step"] < int(found.group(1))
    assert all(value.isfinite().all() for value in ckpt["state_dict"].values())


# Dropout draws random numbers every step: the resumed run must restore every rank's RNG states.
RESUMABLE = ("--trainer.max_epochs", "2", "--model.network.init_args.dropout", "0.3")
DATALOADER = ("--data.init_args.in_memory", "false", "--data.init_args.num_workers", "1")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result, _ = fit(run_dir, *RESUMABLE)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(run_dir), weights_only=True)
    assert ckpt["global_step"] == 20  # 2 epochs of 10 steps (1258 samples, 2 ranks, batch 64)
    return ckpt["state_dict"]


@pytest.mark.parametrize(
    ("checkpointing", "kill_step", "resume_step"),
    [
        ((), 13, 10),  # the default, a checkpoint per epoch: resumes at the start of epoch 1
        (("--checkpoint.every_n_train_steps", "4"), 14, 12),  # resumes mid-epoch 1, at its third batch
        # The same through torchdata's StatefulDataLoader and a worker process: same batches, same weights.
        (("--checkpoint.every_n_train_steps", "4", *DATALOADER), 14, 12),
    ],
    ids=["after-an-epoch", "mid-epoch", "mid-epoch-dataloader"],
)
def test_a_killed_run_resumes_to_the_same_weights(uninterrupted, tmp_path, checkpointing, kill_step, resume_step):
    run_dir = tmp_path / "run"
    killed, _ = fit(run_dir, *RESUMABLE, *checkpointing, *fail_at(kill_step, -1, "sigkill"))
    assert killed.returncode == -9
    last = last_checkpoint(run_dir)
    assert torch.load(last, weights_only=True)["global_step"] == resume_step
    resumed, _ = fit(run_dir, *RESUMABLE, *checkpointing, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = torch.load(last, weights_only=True)
    assert final["global_step"] == 20
    assert final["state_dict"].keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        assert torch.equal(final["state_dict"][name], value), name


def test_a_port_already_in_use_fails_fast_with_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        start = time.monotonic()
        args = quick_args(tmp_path / "run", "--trainer.devices", "2", "--trainer.strategy.init_args.timeout", "0:02:00")
        result = run_project("fit", *args, cwd=REPO, env=project_env(MASTER_PORT=port), timeout=120)
    assert result.returncode != 0
    assert f"port: {port}" in result.stderr and "address already in use" in result.stderr
    assert "rank 0: every process must start with the same num_nodes and devices" in result.stderr  # the hint
    assert time.monotonic() - start < 60  # rank 1, waiting on the foreign listener, was stopped: no 2-minute wait
    assert not (tmp_path / "run").exists()


def test_a_peer_that_never_arrives_fails_after_the_configured_timeout(tmp_path):
    """Node 0 of two, and node 1 never starts: the wait ends at the config's process-group timeout."""
    args = quick_args(tmp_path / "run", "--trainer.num_nodes", "2", "--trainer.strategy.init_args.timeout", "0:00:05")
    start = time.monotonic()
    result = run_project("fit", *args, cwd=REPO, env=project_env(NODE_RANK="0", MASTER_ADDR="127.0.0.1"), timeout=120)
    seconds = time.monotonic() - start
    assert result.returncode != 0
    assert re.search(r"Timed out after \d+ seconds waiting for clients. 1/2 clients joined", result.stderr)
    assert 5 <= seconds < 60
    assert not (tmp_path / "run").exists()
