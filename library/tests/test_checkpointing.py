"""Checkpoint files: atomic under SIGKILL (written in the foreground or the background), weights-only, RNG states
round-trip, the loader resumes mid-epoch, periodic background checkpoints resume exactly."""

import random
import signal
import time

import numpy as np
import pytest
import torch
from helpers import (
    LIBRARY,
    REPO,
    checkpoint_dir,
    finish,
    last_checkpoint,
    project_env,
    quick_args,
    run_project,
    start_python,
)
from torch.utils.data import SequentialSampler

from trainfleet.checkpoints.files import (
    AsyncAtomicCheckpointIO,
    AtomicCheckpointIO,
    CheckpointError,
    load_checkpoint_file,
    rng_states,
    set_rng_states,
)
from trainfleet.data.loaders import TensorBatchLoader

SAVER = """
import sys, torch
from trainfleet.checkpoints import files as checkpoint_files
io, weights = getattr(checkpoint_files, sys.argv[3])(), torch.arange(8_000_000, dtype=torch.float32)  # 32 MB per save
start = int(sys.argv[2])
for i in range(start, start + 1000):
    io.save_checkpoint({"i": i, "w": weights + i}, sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("writer", ["AtomicCheckpointIO", "AsyncAtomicCheckpointIO"])
def test_killing_the_process_mid_save_leaves_the_previous_checkpoint_readable(tmp_path, writer):
    """The background writer is killed in its thread, while the training loop waits for it to finish."""
    ckpt, partial = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    AtomicCheckpointIO().save_checkpoint({"i": -1, "w": torch.zeros(1)}, ckpt)
    for round_ in range(2):
        partial.unlink(missing_ok=True)  # the last round's cut-short file
        saver = start_python("-c", SAVER, str(ckpt), str(round_ * 1000), writer, cwd=tmp_path)
        try:
            # Kill while a save is half written: the partial file exists and is growing.
            deadline = time.monotonic() + 60
            while not (partial.exists() and partial.stat().st_size > 1_000_000) and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            saver.kill()
        assert finish(saver).returncode == -signal.SIGKILL
        assert 0 < partial.stat().st_size < 32_000_000  # the kill did cut a save short
        assert list(tmp_path.glob("*.ckpt")) == [ckpt]  # the partial file is hidden, never taken for a checkpoint
        loaded = torch.load(ckpt, weights_only=True)  # a whole earlier save
        expected = torch.zeros(1) if loaded["i"] == -1 else torch.arange(8_000_000, dtype=torch.float32) + loaded["i"]
        assert torch.equal(loaded["w"], expected)


def test_a_background_save_writes_what_a_synchronous_one_does_as_it_was_at_the_call(tmp_path):
    """The tensors are copied before the call returns: a step taken during the write changes nothing in the file."""
    weights, rng = torch.randn(1_000_000), torch.get_rng_state()
    checkpoint = {"state_dict": {"w": weights}, "rng_states": [{"torch": rng}], "loops": {"batch": 3}}
    AtomicCheckpointIO().save_checkpoint(checkpoint, tmp_path / "sync.ckpt")
    writer = AsyncAtomicCheckpointIO()
    writer.save_checkpoint(checkpoint, tmp_path / "async.ckpt")
    weights.add_(1.0)  # the next optimizer step, in place, while the file is being written
    checkpoint["loops"]["batch"] = 4
    writer.teardown()  # waits for the write
    sync, background = (torch.load(tmp_path / name, weights_only=True) for name in ("sync.ckpt", "async.ckpt"))
    assert background.keys() == sync.keys() and background["loops"] == sync["loops"] == {"batch": 3}
    assert torch.equal(background["state_dict"]["w"], sync["state_dict"]["w"])
    assert torch.equal(background["rng_states"][0]["torch"], rng)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["async.ckpt", "sync.ckpt"]
    writer.save_checkpoint(checkpoint, tmp_path / "again.ckpt")  # the same shapes: into the first save's copies
    writer.teardown()
    again = torch.load(tmp_path / "again.ckpt", weights_only=True)
    assert torch.equal(again["state_dict"]["w"], weights) and again["loops"] == {"batch": 4}


def test_a_background_save_that_fails_raises_at_the_next_save_and_keeps_the_previous_checkpoint(tmp_path):
    writer, ckpt = AsyncAtomicCheckpointIO(), tmp_path / "last.ckpt"
    writer.save_checkpoint({"i": 0}, ckpt)
    writer.save_checkpoint({"i": 1, "bad": lambda: 0}, ckpt)  # a lambda cannot be pickled
    with pytest.raises(Exception):  # noqa: B017 (whatever torch.save raises for an unpicklable object)
        writer.save_checkpoint({"i": 2}, ckpt)
    writer.teardown()
    assert [path.name for path in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(ckpt, weights_only=True)["i"] == 0


# Periodic checkpoints, written in the background: what the launchers in scripts/ pass (every 30 minutes there). Every
# 7 steps here (an interval of 0, checked every 7 steps): digits on one process has 20 steps per epoch, so the run
# that fails at step 30 resumes from step 28, inside epoch 1 and not at its last batch.
PERIODIC = (
    "--trainer.plugins", "trainfleet.checkpoints.files.AsyncAtomicCheckpointIO",
    "--periodic.every", "0:00:00", "--periodic.check_every_n_steps", "7",
    "--trainer.max_epochs", "2", "--model.network.init_args.dropout", "0.3",
)  # fmt: skip


@pytest.mark.slow
def test_a_run_failed_after_a_periodic_background_checkpoint_resumes_mid_epoch_to_the_same_weights(tmp_path):
    """The failure comes while step 28's checkpoint may still be being written: it is finished before the exit."""
    env = project_env(PYTHONPATH=str(LIBRARY / "tests"))
    reference = run_project("fit", *quick_args(tmp_path / "reference", *PERIODIC), cwd=REPO, env=env)
    assert reference.returncode == 0, reference.stderr[-3000:]
    fail_at_30 = ("--trainer.callbacks+=fault_injection.FailAt", "--trainer.callbacks.step", "30")
    failed = run_project("fit", *quick_args(tmp_path / "run", *PERIODIC, *fail_at_30), cwd=REPO, env=env)
    assert failed.returncode != 0 and "injected failure on rank 0 at step 30" in failed.stderr
    saved = checkpoint_dir(tmp_path / "run")
    assert sorted(path.name for path in saved.iterdir()) == ["epoch=0-step=20.ckpt", "last.ckpt"]  # none partial
    assert torch.load(saved / "last.ckpt", weights_only=True)["global_step"] == 28
    resume = quick_args(tmp_path / "run", *PERIODIC, "--ckpt_path", "last")
    resumed = run_project("fit", *resume, cwd=REPO, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = torch.load(last_checkpoint(tmp_path / "reference"), weights_only=True)
    final = torch.load(last_checkpoint(tmp_path / "run"), weights_only=True)
    assert final["global_step"] == expected["global_step"] == 40
    for name, value in expected["state_dict"].items():
        assert torch.equal(final["state_dict"][name], value), name


def test_a_save_interrupted_by_an_exception_leaves_no_partial_file_and_the_previous_checkpoint(tmp_path):
    """A second Ctrl-C raises in the middle of a save (runtime/preemption.py's ``Interrupted``, a SystemExit)."""

    class CtrlC:
        def __reduce__(self):
            raise SystemExit(130)

    ckpt = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"i": 0, "w": torch.zeros(1_000_000)}, ckpt)
    with pytest.raises(SystemExit):  # pickled after the tensor: the partial file holds its bytes by then
        AtomicCheckpointIO().save_checkpoint({"w": torch.ones(1_000_000), "later": CtrlC()}, ckpt)
    assert [path.name for path in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(ckpt, weights_only=True)["i"] == 0


def test_a_checkpoint_with_pickled_code_is_refused_and_the_code_never_runs(tmp_path):
    class Payload:
        def __reduce__(self):
            return (open, (str(tmp_path / "pwned"), "w"))

    torch.save({"state_dict": {}, "extra": Payload()}, tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match="refusing to load .*evil.ckpt"):
        load_checkpoint_file(tmp_path / "evil.ckpt")
    with pytest.raises(CheckpointError, match="refusing to load"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "evil.ckpt")
    assert not (tmp_path / "pwned").exists()


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.save({"rng": rng_states()}, tmp_path / "rng.ckpt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_states(torch.load(tmp_path / "rng.ckpt", weights_only=True)["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def _loader() -> TensorBatchLoader:
    return TensorBatchLoader((torch.arange(10),), SequentialSampler(range(10)), batch_size=3)


def test_the_loader_resumes_at_the_saved_batch_and_a_finished_epoch_starts_over():
    loader = _loader()
    batches = iter(loader)
    next(batches), next(batches)
    mid_epoch = loader.state_dict()
    resumed = _loader()
    resumed.load_state_dict(mid_epoch)
    assert [batch.tolist() for [batch] in resumed] == [[6, 7, 8], [9]]
    assert [batch.tolist() for [batch] in resumed][0] == [0, 1, 2]  # only the first epoch skips
    # Saved at an epoch's last batch: Lightning resumes at the next epoch, which must be whole.
    finished = _loader()
    finished.load_state_dict({"batches_done": len(finished)})
    assert len(list(finished)) == 4


@pytest.mark.slow
def test_with_two_processes_the_periodic_checkpoint_comes_at_the_preemption_checks_exchange(tmp_path):
    """Rank 0's clock rides on the signal flags' exchange every preemption.check_every_n_steps (7), not on a
    broadcast of its own every periodic.check_every_n_steps (5): a run failing at step 16 has step 14's last.ckpt."""
    periodic = ("--periodic.every", "0:00:00", "--periodic.check_every_n_steps", "5")
    fail_at_16 = ("--trainer.callbacks+=fault_injection.FailAt", "--trainer.callbacks.step", "16")
    flags = ("--trainer.devices", "2", "--preemption.check_every_n_steps", "7", *periodic, *fail_at_16)
    failed = run_project(
        "fit", *quick_args(tmp_path, *flags), cwd=REPO, env=project_env(PYTHONPATH=str(LIBRARY / "tests"))
    )
    assert failed.returncode != 0 and "injected failure on rank 0 at step 16" in failed.stderr
    assert torch.load(last_checkpoint(tmp_path), weights_only=True)["global_step"] == 14
