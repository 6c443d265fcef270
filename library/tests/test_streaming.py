"""StreamingDataModule on LitData shards that scripts/make_shards.py writes from a real image folder (the digits as
PNGs): a 2-process fit, exact evaluation on 1, 2 and 3 processes, exact resume after SIGKILL, bad shards."""

import json
import re
import subprocess
import sys

import pytest
import torch
from helpers import (
    LIBRARY,
    REPO,
    assert_same_weights,
    last_checkpoint,
    last_weights,
    project_env,
    quick_args,
    run_folder,
    run_project,
)

pytest.importorskip("torchvision")
sys.path.insert(0, str(REPO / "scripts"))
from write_digit_images import write_digit_images  # noqa: E402

pytest.importorskip("litdata")

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

from test_faults import fail_at  # noqa: E402

from trainfleet.data import StreamingDataModule  # noqa: E402

STREAMING_CONFIG = str(REPO / "configs" / "streaming.yaml")
# Random crops and dropout: the resumed run must draw the same numbers. One loader worker per rank.
RESUMABLE = (
    *("--data.init_args.image_size", "8", "--data.init_args.crop_padding", "1", "--data.init_args.num_workers", "1"),
    *("--model.network.init_args.dropout", "0.3", "--checkpoint.every_n_train_steps", "3"),
)


def stream_args(run_dir, shards, *extra: str) -> list[str]:
    args = ("--config", STREAMING_CONFIG, "--data.init_args.root", str(shards), "--trainer.max_epochs", "2")
    return quick_args(run_dir, *args, *extra)


def fit(run_dir, shards, *extra: str) -> subprocess.CompletedProcess:
    args = stream_args(run_dir, shards, "--trainer.devices", "2", *RESUMABLE, *extra)
    return run_project("fit", *args, cwd=REPO, env=project_env(PYTHONPATH=str(LIBRARY / "tests")))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    images = write_digit_images(tmp_path_factory.mktemp("images"))
    output = tmp_path_factory.mktemp("shards")
    command = [sys.executable, str(REPO / "scripts" / "make_shards.py")]
    command += [
        "--data",
        "trainfleet.data.ImageFolderDataModule",
        "--data.root",
        str(images),
        "--data.grayscale",
        "true",
        "--output",
        str(output),
        "--chunk_bytes",
        "16KB",
    ]
    result = subprocess.run(command, cwd=REPO, env=project_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return output


@pytest.fixture(scope="module")
def uninterrupted(shards, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("stream_fit")
    result = fit(run_dir, shards)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_the_script_writes_every_split_with_its_classes(shards):
    meta = json.loads((shards / "dataset.json").read_text())
    assert meta == {"classes": [str(digit) for digit in range(10)], "samples": {"train": 1258, "val": 180, "test": 359}}
    assert len(list((shards / "train").glob("chunk-*.bin"))) > 2  # several chunks to shard across ranks


def test_only_augmenting_transforms_give_streamed_samples_seeds(shards):
    plain = StreamingDataModule(root=str(shards))  # presets without augmentation: nothing draws, nothing seeded
    plain.setup("fit")
    train = plain.train_dataloader().dataset
    assert not train.seeded and not plain.splits["test"].shards.seeded
    raw = plain.shards("train")  # no transform: the stored image
    assert torch.equal(train[5][0], plain.transforms["train"](raw[5][0])) and train[5][1] == raw[5][1]
    augmented = StreamingDataModule(root=str(shards), image_size=8, crop_padding=1)
    assert augmented.train_dataloader().dataset.seeded


def test_a_two_process_fit_streams_every_step(uninterrupted):
    ckpt = torch.load(last_checkpoint(uninterrupted), weights_only=True)
    # With 2 ranks LitData drops what would make the ranks' step counts differ: 2 epochs of 629 // 64 = 9 steps.
    assert ckpt["global_step"] == 18
    assert list(ckpt["hyper_parameters"]["network"]["init_args"]["input_shape"]) == [1, 8, 8]
    metrics = (run_folder(uninterrupted) / "metrics.csv").read_text()
    assert "val_acc" in metrics.splitlines()[0]


def test_accuracy_on_the_streamed_test_set_is_identical_on_one_two_and_three_processes(uninterrupted, shards, tmp_path):
    metrics = {}
    for devices in (1, 2, 3):
        run_dir = tmp_path / f"test_{devices}"
        ckpt = str(last_checkpoint(uninterrupted))
        result = run_project(
            "test", *stream_args(run_dir, shards, "--trainer.devices", str(devices), "--ckpt_path", ckpt), cwd=REPO
        )
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[devices] = json.loads((run_folder(run_dir) / "test_metrics.json").read_text())
    # 359 test samples: LitData's own sharding would drop 1 of them on 2 ranks and 2 on 3 (drop_last).
    assert metrics[1]["test_acc"] == metrics[2]["test_acc"] == metrics[3]["test_acc"]
    assert metrics[1]["test_acc"] > 0.2  # 18 steps with random crops: far from trained, but above chance (0.1)
    assert metrics[3]["test_loss"] == pytest.approx(metrics[1]["test_loss"], rel=1e-5)


def test_a_run_killed_mid_epoch_resumes_to_the_same_weights(uninterrupted, shards, tmp_path):
    run_dir = tmp_path / "run"
    killed = fit(run_dir, shards, *fail_at(14, -1, "sigkill"))
    assert killed.returncode == -9
    last = last_checkpoint(run_dir)
    assert torch.load(last, weights_only=True)["global_step"] == 12  # mid-epoch 1, at its fourth batch
    resumed = fit(run_dir, shards, "--ckpt_path", str(last))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_weights(last_weights(run_dir), last_weights(uninterrupted))


def test_shards_of_another_schema_are_refused_naming_them(shards, tmp_path):
    import litdata

    root = tmp_path / "other"
    for split in ("train", "val", "test"):
        litdata.optimize(
            fn=lambda i: (torch.zeros(2), i),
            inputs=list(range(4)),
            output_dir=str(root / split),
            chunk_bytes="1MB",
            num_workers=1,
            start_method="fork",
            verbose=False,
        )
    (root / "dataset.json").write_text((shards / "dataset.json").read_text())
    with pytest.raises(ValueError, match=re.escape(f"shards at {root / 'train'} hold items of another schema")):
        StreamingDataModule(root=str(root))


def test_missing_shards_exit_2_before_starting(tmp_path):
    run_dir = tmp_path / "run"
    result = run_project("fit", *stream_args(run_dir, tmp_path / "none", "--trainer.devices", "2"), cwd=REPO)
    assert result.returncode == 2
    assert f"no shards at {tmp_path / 'none'}: {tmp_path / 'none' / 'dataset.json'} is missing" in result.stderr
    assert not run_dir.exists()
