"""Exact resume on every data path, from every kind of checkpoint: the README's promise of bit-identical weights,
tested where it is made.

Each case trains once uninterrupted for 3 epochs (the reference), writing on the way every kind of checkpoint:

- ``epoch-end``: written when an epoch ends (Lightning's ``on_train_epoch_end``), as the default config's per-epoch
  ``last.ckpt`` is; the run resumes at the start of the next epoch.
- ``mid-epoch``: ``every_n_train_steps`` inside an epoch; the loader resumes at the very next batch.
- ``last-batch``: ``every_n_train_steps`` (or a SIGTERM stop) on an epoch's last batch, written before that epoch
  ends: Lightning finishes the epoch on resume and starts the next one.
- ``last-batch-twice``: the ``last-batch`` run's own checkpoint at the next epoch's last batch, resumed in turn (a job
  requeued twice): Lightning left that epoch's counters as if it had ended, and the second resume trained it again.
- ``end-of-fit``: a finished ``fit`` with ``max_epochs 2`` resumed with ``max_epochs 3 --ckpt_path last`` (the
  README's command), against the reference's 3 epochs; the learning-rate schedule's length given (``total_steps``),
  as by default it is the run's.

Runs resumed from copies of the reference's checkpoints (and the end-of-fit pair) must end with its weights, bit for
bit. The cases cover the matrix pairwise (every pair of values of any two factors appears in some case), not its
full cross product, which would cost minutes. That catches each failure mode found or guarded against:

- The order of the epoch a run resumes into (the sampler's epoch when Lightning makes the loader's iterator, before
  its ``set_epoch``; workers take indices ahead) and the loader's position at an epoch's last batch: every kind on
  both DataLoader paths (image folder: torchdata's loader; shards: LitData's), each with 0 and with 2 workers, on 1
  and 2 processes.
- LitData's epoch after a mid-epoch resume: mid-epoch on shards with 0 and 2 workers, crossing into the next epoch.
- Augmentation seeded per sample and epoch, and dropout (0.3 throughout) drawing from restored RNG states: crops and
  flips on both DataLoader paths, with and without workers, on 1 and 2 processes; every case has dropout.
- The in-memory fast path (``TensorBatchLoader``, exact before this test: its batches are drawn lazily): last-batch
  here on 1 process; epoch-end and mid-epoch on 2 processes in ``tests/test_faults.py`` (killed runs), which also
  resumes the DataLoader path mid-epoch with a worker and no augmentation.

| case | path | processes | workers | augmentation | kinds |
| --- | --- | --- | --- | --- | --- |
| memory-1 | digits in memory | 1 | - | - | last-batch, last-batch-twice |
| folder-1 | image folder | 1 | 0 | off | epoch-end, last-batch, last-batch-twice, end-of-fit (the issue's command) |
| folder-2-workers-augmented | image folder | 2 | 2 | on | epoch-end, mid-epoch, last-batch |
| stream-1-workers-augmented | LitData shards | 1 | 2 | on | epoch-end, mid-epoch |
| stream-2-augmented | LitData shards | 2 | 0 | on | mid-epoch, last-batch |
| stream-2-workers | LitData shards | 2 | 2 | off | epoch-end, end-of-fit |
"""

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, checkpoint_dir, differing_weights, last_checkpoint, quick_args, run_project

pytest.importorskip("torchvision")
sys.path.insert(0, str(REPO / "scripts"))
from write_digit_images import write_digit_images  # noqa: E402

from trainfleet.lightning_internals import resume_point  # noqa: E402

EPOCHS = 3
# Every rank draws from its RNG states each step (dropout); the learning rate changes each step.
TRAINING = ("--trainer.max_epochs", str(EPOCHS), "--model.network.init_args.dropout", "0.3")
# The epoch-end checkpoints, beside the step checkpoints of `checkpoint` (ModelCheckpoint takes one trigger each).
AT_EPOCH_END = (
    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
    *("--trainer.callbacks.every_n_epochs", "1", "--trainer.callbacks.save_top_k", "-1"),
    *("--trainer.callbacks.filename", "end-{epoch}", "--trainer.callbacks.save_last", "false"),
)
FOLDER, STREAM = str(REPO / "configs" / "image_folder.yaml"), str(REPO / "configs" / "streaming.yaml")
AUGMENTED = ("--data.init_args.image_size", "8", "--data.init_args.crop_padding", "1")
FLIPPED = (*AUGMENTED, "--data.init_args.horizontal_flip", "true")


@dataclass
class Case:
    data: tuple[str, ...]  # the data flags
    processes: int
    steps_per_epoch: int
    kinds: tuple[str, ...]


WORKERS = ("--data.init_args.num_workers", "2")
CASES = {
    # 1,258 training digits in batches of 160: 8 steps an epoch.
    "memory-1": Case(("--data.init_args.batch_size", "160"), 1, 8, ("last-batch", "last-batch-twice")),
    # 60 training images in batches of 8: 8 steps an epoch on 1 process, 4 on 2.
    "folder-1": Case(("--config", FOLDER), 1, 8, ("epoch-end", "last-batch", "last-batch-twice", "end-of-fit")),
    "folder-2-workers-augmented": Case(
        ("--config", FOLDER, *FLIPPED, *WORKERS), 2, 4, ("epoch-end", "mid-epoch", "last-batch")
    ),
    "stream-1-workers-augmented": Case(("--config", STREAM, *FLIPPED, *WORKERS), 1, 8, ("epoch-end", "mid-epoch")),
    # LitData drops what would make the ranks' step counts differ: 30 samples per rank, 3 full batches.
    "stream-2-augmented": Case(("--config", STREAM, *AUGMENTED), 2, 3, ("mid-epoch", "last-batch")),
    "stream-2-workers": Case(("--config", STREAM, *WORKERS), 2, 3, ("epoch-end", "end-of-fit")),
}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """6 digits of each class per split: 60 training images."""
    return write_digit_images(tmp_path_factory.mktemp("images"), per_class=6)


@pytest.fixture(scope="module")
def shards(images, tmp_path_factory) -> Path:
    pytest.importorskip("litdata")
    from make_shards import write_shards

    from trainfleet.data import ImageFolderDataModule

    output = tmp_path_factory.mktemp("shards")
    write_shards(ImageFolderDataModule(root=str(images), grayscale=True), str(output), "2KB", 1, 0)
    return output


def data_flags(case: Case, images: Path, shards: Path) -> list[str]:
    flags = list(case.data)
    if FOLDER in flags or STREAM in flags:
        root = images if FOLDER in flags else shards
        flags += ["--data.init_args.root", str(root), "--data.init_args.batch_size", "8"]
        flags += ["--data.init_args.grayscale", "true"] if FOLDER in flags else []
        flags += [] if "--data.init_args.num_workers" in flags else ["--data.init_args.num_workers", "0"]
    return flags


def fit(root: Path, case: Case, flags: list[str], *extra: str) -> None:
    args = quick_args(root, "--trainer.devices", str(case.processes), *TRAINING, *flags, *extra)
    result = run_project("fit", *args, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]


def trained(checkpoint: Path) -> tuple[int, dict[str, torch.Tensor]]:
    """The global step and the weights of CHECKPOINT."""
    saved = torch.load(checkpoint, weights_only=True)
    return saved["global_step"], saved["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(name, images, shards, tmp_path):
    case = CASES[name]
    steps, half = case.steps_per_epoch, case.steps_per_epoch // 2
    flags = data_flags(case, images, shards)
    every_half_epoch = ("--checkpoint.every_n_train_steps", str(half), "--checkpoint.save_top_k", "-1")
    every_half_epoch += ("--checkpoint.filename", "step-{step}")
    checkpointing = (*every_half_epoch, *AT_EPOCH_END)
    fit(tmp_path / "reference", case, flags, *checkpointing)
    saved = checkpoint_dir(tmp_path / "reference")
    expected = trained(saved / f"end-epoch={EPOCHS - 1}.ckpt")
    assert expected[0] == EPOCHS * steps
    starts = {"epoch-end": "end-epoch=0.ckpt", "mid-epoch": f"step-step={steps + half}.ckpt"}
    starts["last-batch"] = f"step-step={steps}.ckpt"
    starts["last-batch-twice"] = f"step-step={2 * steps}.ckpt"  # written by the last-batch kind's resumed run
    differ = []
    for kind in case.kinds:
        root = tmp_path / kind
        if kind == "end-of-fit":
            # The schedule's length fixed: by default it is the run's, and the 2-epoch fit's decays sooner.
            fixed = ("--model.scheduler.init_args.total_steps", str(EPOCHS * steps))
            fit(root, case, flags, *fixed, "--trainer.max_epochs", str(EPOCHS - 1))
            fit(root, case, flags, *fixed, "--ckpt_path", "last")
            final = last_checkpoint(root)
        else:
            start = root / "start.ckpt"
            root.mkdir()
            source = checkpoint_dir(tmp_path / "last-batch") if kind == "last-batch-twice" else saved
            shutil.copy(source / starts[kind], start)
            fit(root, case, flags, *checkpointing, "--ckpt_path", str(start))
            final = checkpoint_dir(root) / f"end-epoch={EPOCHS - 1}.ckpt"
        step, weights = trained(final)
        differ += [f"{kind}: step {step}"] if step != expected[0] else []
        differ += [f"{kind}: {name}" for name in differing_weights(weights, expected[1])]
    assert differ == []


@pytest.mark.parametrize(
    ("processed", "started", "last_batch", "expected"),
    [
        (0, 0, False, (0, False)),  # a new run (or a later epoch's loader, made before that epoch starts)
        (1, 2, False, (1, True)),  # a checkpoint inside epoch 1: its position is loaded
        (1, 2, True, (2, False)),  # at epoch 1's last batch: Lightning goes on with epoch 2, from its start
        (2, 2, True, (2, False)),  # at epoch 1's end
    ],
    ids=["new", "mid-epoch", "last-batch", "epoch-end"],
)
def test_the_resume_point_is_the_epoch_lightning_trains_next(processed, started, last_batch, expected):
    epochs = SimpleNamespace(processed=processed, started=started)
    batches = SimpleNamespace(is_last_batch=last_batch)
    fit_loop = SimpleNamespace(
        epoch_progress=SimpleNamespace(current=epochs), epoch_loop=SimpleNamespace(batch_progress=batches)
    )
    assert resume_point(SimpleNamespace(fit_loop=fit_loop)) == expected
