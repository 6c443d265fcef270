"""ImageFolderDataModule on a real image folder (the digits as PNG files): DDP fit, exact evaluation, bad input."""

import csv
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, last_checkpoint, processes_left, quick_args, run_folder, run_in_process, run_project
from test_cli_errors import write_images

pytest.importorskip("torchvision")
sys.path.insert(0, str(REPO / "scripts"))
from write_digit_images import write_digit_images  # noqa: E402

from trainfleet.data import ImageFolderDataModule  # noqa: E402
from trainfleet.data.image_folder import load_image  # noqa: E402
from trainfleet.data.samplers import SeededSampler  # noqa: E402
from trainfleet.data.transforms import ImageToFloat, augments  # noqa: E402

IMAGE_FOLDER_CONFIG = str(REPO / "configs" / "image_folder.yaml")


def image_args(run_dir, root, *extra: str) -> list[str]:
    """A fast run on the image folder ROOT: 4 epochs of batch 16, one channel, images loaded in the rank itself."""
    return quick_args(
        run_dir,
        *("--config", IMAGE_FOLDER_CONFIG, "--data.init_args.root", str(root), "--data.init_args.grayscale", "true"),
        *("--data.init_args.batch_size", "16", "--data.init_args.num_workers", "0"),
        *("--trainer.max_epochs", "4"),  # the schedule fits the run by itself
        *extra,
    )


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_digit_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def fitted(images, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("image_fit")
    result = run_project("fit", *image_args(run_dir, images, "--trainer.devices", "2"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def test_metrics(images, fitted, tmp_path_factory):
    metrics = {}
    for devices in (1, 2, 3):
        run_dir = tmp_path_factory.mktemp(f"image_test_{devices}")
        ckpt = str(last_checkpoint(fitted))
        args = image_args(run_dir, images, "--trainer.devices", str(devices), "--ckpt_path", ckpt)
        result = run_project("test", *args, cwd=REPO)
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[devices] = json.loads((run_folder(run_dir) / "test_metrics.json").read_text())
    return metrics


@pytest.mark.slow
def test_a_two_process_fit_reads_the_folders_and_links_classes_and_shape_to_the_network(fitted):
    ckpt = torch.load(last_checkpoint(fitted), weights_only=True)
    assert ckpt["global_step"] == 4 * 40  # 4 epochs of ceil(1258 train images / 2 ranks / 16)
    network = ckpt["hyper_parameters"]["network"]["init_args"]
    assert network["num_classes"] == 10 and list(network["input_shape"]) == [1, 8, 8]


@pytest.mark.slow
def test_held_out_accuracy_is_high_and_identical_on_one_two_and_three_processes(test_metrics):
    # 359 test images: not divisible by 2 or 3, so a padding or dropping sampler would change the result.
    assert test_metrics[1]["test_acc"] >= 0.90
    assert test_metrics[1]["test_acc"] == test_metrics[2]["test_acc"] == test_metrics[3]["test_acc"]
    assert test_metrics[3]["test_loss"] == pytest.approx(test_metrics[1]["test_loss"], rel=1e-5)


@pytest.mark.slow
def test_predict_on_a_folder_of_new_images_writes_each_path_its_class_and_probabilities(images, fitted, tmp_path):
    new = tmp_path / "new"
    expected = {}
    for digit in ("3", "7"):  # test images, copied under other names into one folder (and a subfolder)
        for number, image in enumerate(sorted((images / "test" / digit).glob("*.png"))[:3]):
            copy = new / ("more" if number else "") / f"{digit}_{number}.png"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(image, copy)
            expected[str(copy)] = digit
    flags = ("--data.init_args.predict_path", str(new), "--ckpt_path", str(last_checkpoint(fitted)))
    result = run_project("predict", *image_args(tmp_path / "run", images, *flags, "--trainer.devices", "2"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    with (run_folder(tmp_path / "run") / "predictions.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["input"] for row in rows] == sorted(expected)  # every file once, in path order, across 2 ranks
    assert sum(row["prediction"] == expected[row["input"]] for row in rows) >= 5  # the class folder's name
    for row in rows:
        probabilities = [float(row[f"probability_{digit}"]) for digit in "0123456789"]
        assert sum(probabilities) == pytest.approx(1, abs=1e-5) and max(probabilities) == float(
            row[f"probability_{row['prediction']}"]
        )


def test_one_folder_of_classes_is_split_by_the_fractions(images):
    data = ImageFolderDataModule(root=str(images / "train"), grayscale=True, val_fraction=0.1, test_fraction=0.2)
    data.setup("fit")
    assert {name: len(split) for name, split in data.splits.items()} == {"train": 880, "val": 126, "test": 252}
    indices = [index for name in ("train", "val", "test") for index in data.splits[name].dataset.indices]
    assert sorted(indices) == list(range(1258))


def test_augmentation_is_seeded_per_sample_and_epoch(images):
    data = ImageFolderDataModule(root=str(images), grayscale=True, image_size=8, crop_padding=2, horizontal_flip=True)
    data.setup("fit")
    train = data.splits["train"]
    sampler = data.train_dataloader().sampler
    first = [train[pair][0] for pair in list(sampler)[:8]]
    assert all(torch.equal(a, train[pair][0]) for a, pair in zip(first, list(sampler)[:8], strict=True))
    sampler.set_epoch(1)
    again = {index: seed for index, seed in sampler}
    crops = [train[(index, again[index])][0] for index, _ in list(data.train_dataloader().sampler)[:8]]
    assert any(not torch.equal(a, b) for a, b in zip(first, crops, strict=True))  # another epoch, other crops
    assert data.input_shape == (1, 8, 8) and first[0].shape == (1, 8, 8)


def test_only_augmenting_transforms_give_training_samples_seeds(images):
    from torchvision.transforms import v2

    plain = ImageFolderDataModule(root=str(images), grayscale=True)  # presets without augmentation: nothing draws
    plain.setup("fit")
    assert not plain.augmented and not isinstance(plain.train_dataloader().sampler, SeededSampler)
    index = next(iter(plain.train_dataloader().sampler))
    assert torch.equal(plain.splits["train"][index][0], ImageToFloat()(plain.folders["train"][index][0]))
    assert ImageFolderDataModule(root=str(images), grayscale=True, horizontal_flip=True).augmented
    assert augments([v2.ToImage()], [v2.ToImage()])  # transforms of the user's own: counted as random, seeded
    assert not augments(None, [v2.ToImage()])


def test_the_presets_tensor_step_gives_torchvisions_numbers(images):
    from torchvision.transforms import v2

    for mode in ("L", "RGB"):
        image = load_image(str(sorted((images / "train" / "3").glob("*.png"))[0]), mode)
        expected = v2.ToDtype(torch.float32, scale=True)(v2.ToImage()(image))
        assert torch.equal(ImageToFloat()(image), expected) and expected.shape[0] == len(mode)


@pytest.mark.parametrize(
    ("folder", "empty_classes", "message"),
    [
        ("missing", (), "image folder not found: {root}/missing"),
        ("", (), "{root}: Couldn't find any class folder"),
        ("", ("3", "7"), "{root}: Found no valid file for the classes 3, 7"),
    ],
    ids=["missing", "empty", "class-without-images"],
)
def test_a_bad_folder_is_refused_naming_it(tmp_path, folder, empty_classes, message):
    for name in empty_classes:
        (tmp_path / name).mkdir()
    with pytest.raises(ValueError, match=re.escape(message.format(root=tmp_path))):
        ImageFolderDataModule(root=str(tmp_path / folder))


@pytest.mark.slow
def test_a_missing_folder_exits_2_before_starting_and_writes_nothing(images, tmp_path):
    run_dir = tmp_path / "run"
    args = image_args(run_dir, images, "--trainer.devices", "2", "--data.init_args.root", str(tmp_path / "missing"))
    result = run_project("fit", *args, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert f"image folder not found: {tmp_path / 'missing'}" in result.stderr
    assert not run_dir.exists()


@pytest.mark.parametrize("num_workers", [-1, 100_000])
def test_a_worker_count_out_of_range_is_refused(images, num_workers):
    with pytest.raises(
        ValueError, match=f"num_workers must be between 0 and the .* CPU cores available, got {num_workers}"
    ):
        ImageFolderDataModule(root=str(images), num_workers=num_workers)


@pytest.mark.slow
def test_an_unreadable_image_is_refused_before_any_rank_starts_naming_the_file_once(images, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(images, root)
    broken = sorted((root / "train" / "5").glob("*.png"))[3]
    broken.write_bytes(b"not a png")
    run_dir = tmp_path / "run"
    result = run_project("fit", *image_args(run_dir, root, "--trainer.devices", "2"), cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert result.stderr.count(f"1 of 1797 images under {root} cannot be read: {broken} (not an image") == 1
    assert "Traceback" not in result.stderr and not run_dir.exists()
    assert processes_left(result) == []


def break_images(root, count: int) -> list[str]:
    """Cuts the first COUNT training PNGs short (as a copy interrupted leaves them); their paths."""
    broken = sorted(str(path) for path in (root / "train").rglob("*.png"))[:count]
    for path in broken:
        cut_short(path)
    return broken


def cut_short(path: str) -> None:
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])


def test_unreadable_training_images_are_listed_at_once_and_skipped_with_the_switch(tmp_path, capsys):
    root = write_images(tmp_path, [8] * 6)
    broken = break_images(root, 5)
    with pytest.raises(ValueError) as refused:
        ImageFolderDataModule(root=str(root))
    message = str(refused.value)
    assert message.startswith(f"5 of 12 images under {root} cannot be read: {broken[0]} (Truncated File Read), ")
    assert "and 2 more; fix or remove them, or give --data.init_args.skip_unreadable true" in message
    data = ImageFolderDataModule(root=str(root), skip_unreadable=True)
    assert len(data.folders["train"]) == 7 and not set(broken) & {path for path, _ in data.folders["train"].samples}
    assert "training without 5 of 12 images" in capsys.readouterr().err


def test_predict_on_a_folder_with_an_unreadable_image_writes_every_row_and_the_reason(tmp_path):
    root = write_images(tmp_path / "images", [8] * 3)
    new = tmp_path / "new"
    shutil.copytree(root / "train", new)
    (new / "notes.txt").write_text("not an image, not an input")
    broken = str(sorted(new.rglob("*.png"))[2])
    cut_short(broken)
    flags = ("--data.init_args.grayscale", "false", "--data.init_args.predict_path", str(new))
    output = run_in_process("predict", *image_args(tmp_path / "run", root, *flags))
    with (run_folder(tmp_path / "run") / "predictions.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    readable = sorted(str(path) for path in new.rglob("*.png") if str(path) != broken)
    assert [row["input"] for row in rows] == [*readable, broken]
    assert all(row["prediction"] in "ab" and row["error"] == "" for row in rows[:-1])
    assert rows[-1]["prediction"] == "" and rows[-1]["error"] == "image file is truncated"
    assert "5 predictions written to" in output and "; 1 inputs could not be read (rows with an error)" in output
