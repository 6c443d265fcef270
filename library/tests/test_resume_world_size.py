"""A fit resumed inside an epoch on another number of processes trains the rest of that epoch's samples, each once
(issue #47). Before, a run on 2 processes stopped after 5 steps and resumed on 1 trained 15 more steps of the
1,258-sample epoch: 938 samples after its 640, 1,578 in all, 320 of them twice.

Each case stops a fit after 5 steps (its step-5 checkpoint is ``last.ckpt``) and resumes it with ``--ckpt_path last``
on another number of processes, for the rest of 2 epochs, or for 5 steps and then again on a third number. It counts
the samples each rank trained on in each epoch (``tests/sample_accounting.py``: each digit carries its index). The
first epoch, all attempts together: every index of the 1,258 exactly once. The second: a fresh run's epoch on the last
world size, as ``DistributedSampler`` gives it (padded with repeats on 3 processes: 1,258 is not a multiple of 3).
Weights across world sizes are not compared (another global batch trains other weights); tests/test_resume.py checks
the same-world-size resume, bit for bit.
"""

import itertools
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, last_checkpoint, quick_args, run_project
from sample_accounting import read_trained
from torch.utils.data import DistributedSampler

from trainfleet.data.base import ranks

TRAIN_SIZE, BATCH, STOP_AT = 1258, 64, 5
RECORD = ("--trainer.callbacks+=sample_accounting.TrainedSamples", "--trainer.callbacks.output_dir")
CASES = {  # name: (the processes of each attempt, extra data flags)
    "2-then-1": ((2, 1), ()),  # the issue's: a node gone
    "1-then-2": ((1, 2), ()),
    "2-then-3-dataloader": ((2, 3), ("--data.init_args.in_memory", "false", "--data.init_args.num_workers", "1")),
    "2-then-1-then-3": ((2, 1, 3), ()),  # stopped again inside the re-split epoch
    # Whole batches only: the rest's 618 samples make 9 batches on 1 process, 42 are left out (as a fresh run leaves
    # out its last incomplete batch on every rank).
    "2-then-1-drop-last": ((2, 1), ("--data.init_args.drop_last", "true")),
}


def fit(root: Path, processes: int, record: Path, *extra: str) -> str:
    data = ("--data.class_path", "sample_accounting.IndexedDigits", "--data.init_args.batch_size", str(BATCH))
    every = ("--trainer.max_epochs", "2", "--checkpoint.every_n_train_steps", str(STOP_AT))
    args = quick_args(root, "--trainer.devices", str(processes), *data, *every, *RECORD, str(record), *extra)
    result = run_project("fit", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


def fresh_epoch(world_size: int, epoch: int, drop_last: bool) -> list[int]:
    """Every index a fresh run on WORLD_SIZE processes trains in EPOCH, all ranks together (seed 42, digits.yaml's);
    DROP_LAST: each rank's last incomplete batch left out."""
    ranks = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(TRAIN_SIZE), world_size, rank, shuffle=True, seed=42)
        sampler.set_epoch(epoch)
        shard = list(sampler)
        ranks.append(shard[: len(shard) // BATCH * BATCH] if drop_last else shard)
    return sorted(itertools.chain(*ranks))


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_a_resume_on_another_world_size_trains_each_sample_of_the_epoch_once(name, tmp_path):
    world_sizes, data = CASES[name]
    *stopped, last = world_sizes
    drop_last = "--data.init_args.drop_last" in data
    said, epoch_0, trained = [], [], 0
    for attempt, processes in enumerate(world_sizes):
        resume = ("--ckpt_path", "last") if attempt else ()
        stop = ("--trainer.max_steps", str(STOP_AT * (attempt + 1))) if attempt < len(stopped) else ()
        said.append(fit(tmp_path / "run", processes, tmp_path / f"attempt{attempt}", *data, *resume, *stop))
        record = read_trained(tmp_path / f"attempt{attempt}")
        assert sorted(record) == ([0] if stop else [0, 1])
        assert sorted(record[0]) == list(range(processes))
        epoch_0 += itertools.chain(*record[0].values())
        if attempt:
            before, rest = world_sizes[attempt - 1], TRAIN_SIZE - trained
            line = f"epoch 0 was checkpointed on {ranks(before)} and resumes on {processes}: the {rest} samples of its"
            assert line in said[attempt]
        if stop:
            assert len(epoch_0) - trained == STOP_AT * BATCH * processes  # 5 steps each, none of them the last
            trained = len(epoch_0)
    if drop_last:  # each sample at most once; left out: less than a step of the last world size
        rest = TRAIN_SIZE - trained
        left_out = rest - rest // last // BATCH * BATCH * last
        assert len(set(epoch_0)) == len(epoch_0) == TRAIN_SIZE - left_out
        assert f"drop_last: {left_out} left out, whole batches only" in said[-1]
    else:
        assert sorted(epoch_0) == list(range(TRAIN_SIZE))  # every sample once, none twice, none left out
    assert sorted(itertools.chain(*record[1].values())) == fresh_epoch(last, 1, drop_last)  # as a fresh run's epoch


@pytest.mark.slow
@pytest.mark.parametrize("then", [1, 3])
def test_a_checkpoint_at_an_epochs_last_batch_resumed_on_other_ranks_trains_the_next_epochs_whole(then, tmp_path):
    """2 processes stop at epoch 0's last step (10 steps of 64: its checkpoint is from that batch, as a preemption stop
    there saves); resumed on THEN processes, the next epochs are fresh THEN-process epochs. Before, on 1 process the
    next epoch trained its last 618 samples only: the loader skipped the 2-process run's 10 batches (1 process's epoch
    is 20), and Lightning, whose count of them was not this epoch length, did not start it afresh."""
    last_step = -(-TRAIN_SIZE // 2 // BATCH)
    stop = ("--trainer.max_steps", str(last_step))
    fit(tmp_path / "run", 2, tmp_path / "first", "--checkpoint.every_n_train_steps", str(last_step), *stop)
    fit(tmp_path / "run", then, tmp_path / "then", "--trainer.max_epochs", "3", "--ckpt_path", "last")
    record = read_trained(tmp_path / "then")
    assert sorted(record) == [1, 2]
    for epoch in (1, 2):
        assert sorted(itertools.chain(*record[epoch].values())) == fresh_epoch(then, epoch, drop_last=False)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """The digits as LitData shards, 6 of each class per split: 60 training images."""
    pytest.importorskip("torchvision")
    pytest.importorskip("litdata")
    sys.path.insert(0, str(REPO / "scripts"))
    from make_shards import write_shards
    from write_digit_images import write_digit_images

    from trainfleet.data import ImageFolderDataModule

    images = write_digit_images(tmp_path_factory.mktemp("images"), per_class=6)
    output = tmp_path_factory.mktemp("shards")
    write_shards(ImageFolderDataModule(root=str(images), grayscale=True), str(output), "2KB", 1, 0)
    return output


@pytest.mark.slow
def test_on_shards_a_resume_on_another_world_size_starts_the_epoch_again_and_says_so(shards, tmp_path):
    """LitData's position is not re-split: the rule is to train the epoch again from its start, on the new ranks.
    60 images in batches of 8: 3 steps an epoch on 2 processes (LitData drops the rest), 8 on 1."""
    data = ("--config", str(REPO / "configs" / "streaming.yaml"), "--data.init_args.root", str(shards))
    data += ("--data.init_args.batch_size", "8", "--data.init_args.num_workers", "0")
    every_2 = ("--trainer.max_epochs", "2", "--checkpoint.every_n_train_steps", "2")
    for processes, extra in ((2, ("--trainer.max_steps", "2")), (1, ("--ckpt_path", "last"))):
        args = quick_args(tmp_path, "--trainer.devices", str(processes), *data, *every_2, *extra)
        result = run_project("fit", *args, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
    said = "epoch 0 was checkpointed on 2 ranks and resumes on 1: LitData's streaming position cannot be split"
    assert said in result.stderr
    assert torch.load(last_checkpoint(tmp_path), weights_only=True)["global_step"] == 2 + 8 + 8
