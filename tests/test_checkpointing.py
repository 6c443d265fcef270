"""Checkpoint files: atomic under SIGKILL, weights-only, RNG states round-trip, the loader resumes mid-epoch."""

import random
import signal
import time

import numpy as np
import pytest
import torch
from conftest import finish, start_python
from torch.utils.data import SequentialSampler

from project.data.loaders import TensorBatchLoader
from project.runs.checkpointing import (
    AtomicCheckpointIO,
    CheckpointError,
    load_checkpoint_file,
    rng_states,
    set_rng_states,
)

SAVER = """
import sys, torch
from project.runs.checkpointing import AtomicCheckpointIO
io, weights = AtomicCheckpointIO(), torch.arange(8_000_000, dtype=torch.float32)  # 32 MB per save
start = int(sys.argv[2])
for i in range(start, start + 1000):
    io.save_checkpoint({"i": i, "w": weights + i}, sys.argv[1])
"""


@pytest.mark.slow
def test_killing_the_process_mid_save_leaves_the_previous_checkpoint_readable(tmp_path):
    ckpt, partial = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    AtomicCheckpointIO().save_checkpoint({"i": -1, "w": torch.zeros(1)}, ckpt)
    for round_ in range(2):
        partial.unlink(missing_ok=True)  # the last round's cut-short file
        saver = start_python("-c", SAVER, str(ckpt), str(round_ * 1000), cwd=tmp_path)
        try:
            # Kill while a save is half written: the partial file exists and is growing.
            deadline = time.monotonic() + 60
            while not (partial.exists() and partial.stat().st_size > 1_000_000) and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            saver.kill()
        assert finish(saver).returncode == -signal.SIGKILL
        assert 0 < partial.stat().st_size < 32_000_000  # the kill did cut a save short
        loaded = torch.load(ckpt, weights_only=True)  # a whole earlier save
        expected = torch.zeros(1) if loaded["i"] == -1 else torch.arange(8_000_000, dtype=torch.float32) + loaded["i"]
        assert torch.equal(loaded["w"], expected)


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
