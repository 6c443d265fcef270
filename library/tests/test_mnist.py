"""The torchvision MNIST module, on tiny IDX files in torchvision's raw layout (no download)."""

import importlib.util
import struct

import pytest
import torch
from helpers import DIGITS_CONFIG, REPO, run_project

from trainfleet.data import MNISTDataModule

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def write_idx(path, array: torch.Tensor) -> None:
    """MNIST's IDX format: magic 0x0000 08 NDIM (unsigned bytes), big-endian int32 dims, then the bytes."""
    header = struct.pack(">I", 0x0800 + array.dim()) + struct.pack(f">{array.dim()}I", *array.shape)
    path.write_bytes(header + array.to(torch.uint8).numpy().tobytes())


@pytest.fixture
def tiny_mnist(tmp_path):
    """30 training and 10 test images; image i is filled with the value i, its label is i % 10."""
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, start, count in (("train", 0, 30), ("t10k", 30, 10)):
        values = torch.arange(start, start + count)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", values.view(-1, 1, 1).expand(-1, 28, 28))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", values % 10)
    return tmp_path


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision is not installed (the `mnist` extra)")
def test_loads_both_parts_as_normalized_images_and_splits_them(tiny_mnist):
    data = MNISTDataModule(root=str(tiny_mnist), download=False, batch_size=4, val_fraction=0.2, test_fraction=0.25)
    data.prepare_data()  # download=False: nothing to fetch
    images, labels = data.load()
    assert images.shape == (40, 1, 28, 28) and images.dtype == torch.float32
    assert labels.dtype == torch.int64
    # Train (0..29) then test (30..39), pixel values scaled to [0, 1].
    assert torch.equal(images[:, 0, 0, 0] * 255, torch.arange(40, dtype=torch.float32))
    assert torch.equal(labels, torch.arange(40) % 10)

    data.setup("fit")
    sizes = {name: len(split) for name, split in data.splits.items()}
    assert sizes == {"train": 22, "val": 8, "test": 10}
    ids = torch.cat([(split.tensors[0][:, 0, 0, 0] * 255).round() for split in data.splits.values()])
    assert sorted(ids.long().tolist()) == list(range(40))  # a partition: every image in exactly one split
    batches = list(data.train_dataloader())
    assert [len(y) for _, y in batches] == [4, 4, 4, 4, 4, 2]


@pytest.mark.skipif(not HAS_TORCHVISION, reason="torchvision is not installed (the `mnist` extra)")
def test_missing_files_without_download_fail_clearly(tmp_path):
    with pytest.raises(RuntimeError, match="Dataset not found"):
        MNISTDataModule(root=str(tmp_path), download=False).load()


@pytest.mark.skipif(HAS_TORCHVISION, reason="checks the message shown when torchvision is missing")
def test_without_torchvision_the_error_names_the_extra(tmp_path):
    with pytest.raises(ImportError, match=r"\.\[mnist\]"):
        MNISTDataModule(root=str(tmp_path), download=False).load()


@pytest.mark.slow
def test_config_overlay_parses_without_torchvision():
    result = run_project(
        "fit", "--config", str(DIGITS_CONFIG), "--config", "configs/mnist.yaml", "--print_config", cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "class_path: trainfleet.data.MNISTDataModule" in result.stdout
    assert "batch_size: 128" in result.stdout and "default_root_dir: runs/mnist" in result.stdout
