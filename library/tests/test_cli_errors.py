"""Bad input exits non-zero with a message that names the problem, before any process group starts, and
writes nothing. In-process: every refusal happens before Lightning launches a process."""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from helpers import DIGITS_CONFIG, REPO, last_checkpoint, quick_args, run_folder, run_in_process
from project.data import DigitsDataModule
from torch import nn

from trainfleet.main import main

ONE_SCREEN = 6  # lines of stderr an error may take: the usage line, the error, a wrapped line or two
IMAGE_FOLDER_CONFIG = str(REPO / "configs" / "image_folder.yaml")
FIT_HELP = "python -m project fit --help"
TORCHVISION = "project.networks.TorchvisionModel"


@pytest.fixture(autouse=True)
def bare_argv(monkeypatch):
    """LightningCLI warns when both sys.argv (pytest's here) and args are given."""
    monkeypatch.setattr(sys, "argv", ["project"])


def _refused(capsys, run_dir, *args: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    assert exit_info.value.code not in (0, None)
    assert not dist.is_initialized()
    assert not run_dir.exists()
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model.no_such_key", "1"], "no_such_key"),
        (["--trainer.max_epochs", "ten"], "trainer.max_epochs"),
        (["--trainer.strategy", "no_such_strategy"], "invalid strategy name"),
        (["--trainer.strategy.init_args.process_group_backend", "glooo"], "unknown process_group_backend 'glooo'"),
        (["--trainer.strategy.init_args.process_group_backend", "nccl"], "'nccl' needs GPUs"),
        (["--trainer.devices", "0"], "devices"),
        (["--trainer.devices", "-2"], "should be an int > 0"),
        (["--trainer.num_nodes", "0"], "`num_nodes` must be a positive integer"),
        (["--data.init_args.batch_size", "0"], "batch_size must be >= 1"),
        (["--preemption.check_every_n_steps", "0"], "preemption.check_every_n_steps must be >= 1, got 0"),
        (["--guard.preemption_check_every_n_steps", "4"], "did you mean preemption.check_every_n_steps?"),  # renamed
        (["--checkpoint.train_time_interval", "abc"], 'Parser key "checkpoint.train_time_interval"'),
    ],
)
def test_bad_config_is_refused(capsys, tmp_path, flags, message):
    assert message in _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))


@pytest.mark.parametrize(
    ("variable", "local_rank", "says"),
    [("LOCAL_RANK", "0", True), ("LOCAL_RANK", "1", False), ("SLURM_LOCALID", "3", False)],
)
def test_a_refusal_is_said_by_the_first_process_of_each_node(capsys, monkeypatch, tmp_path, variable, local_rank, says):
    """torchrun and srun start every process with the same command line: 8 GPUs per node would print it 8 times."""
    monkeypatch.setenv(variable, local_rank)
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", "--trainer.max_epochs", "ten"))
    assert ("error: " in stderr) is says and (stderr == "") is not says


@pytest.mark.parametrize("key", ["checkpoint.train_time_interval", "periodic.every"])
def test_an_interval_that_is_not_a_duration_exits_2_naming_the_key(capsys, tmp_path, key):
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *quick_args(run_dir, f"--{key}", "30m")])
    assert exit_info.value.code == 2 and not run_dir.exists()
    assert f'Parser key "{key}"' in capsys.readouterr().err


def test_missing_config_file(capsys, tmp_path):
    assert "missing.yaml" in _refused(capsys, tmp_path / "run", "fit", "--config", str(tmp_path / "missing.yaml"))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "checkpoint file not found"),
        (b"", "is corrupted or truncated"),
        (b"not a checkpoint" * 100, "is corrupted or truncated"),
    ],
    ids=["missing", "empty", "garbage"],
)
def test_unusable_checkpoint_is_refused(capsys, tmp_path, content, message):
    ckpt = tmp_path / "model.ckpt"
    if content is not None:
        ckpt.write_bytes(content)
    stderr = _refused(capsys, tmp_path / "run", "test", *quick_args(tmp_path / "run", "--ckpt_path", str(ckpt)))
    assert message in stderr and str(ckpt) in stderr


def test_truncated_checkpoint_is_refused(capsys, tmp_path):
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1000)}}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[:2000])  # what a copy cut short leaves
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", "--ckpt_path", str(ckpt)))
    assert f"checkpoint {ckpt} is corrupted or truncated" in stderr


@pytest.mark.parametrize(
    "flags",
    [["--trainer.logger", "false"], ["--checkpoint.dirpath", "{run}/checkpoints"]],
    ids=["no-logger", "dirpath"],
)
def test_a_fresh_fit_never_overwrites_an_earlier_run_in_a_shared_checkpoint_folder(capsys, tmp_path, flags):
    """Without a logger's version folders (or with a fixed dirpath) every run shares one checkpoint folder."""
    earlier = tmp_path / "run" / "checkpoints" / "last.ckpt"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"the earlier run's checkpoint")
    flags = [flag.format(run=tmp_path / "run") for flag in flags]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *quick_args(tmp_path / "run", *flags)])
    assert exit_info.value.code == 2
    assert f"already holds an earlier run's checkpoints ({earlier.parent})" in capsys.readouterr().err
    assert earlier.read_bytes() == b"the earlier run's checkpoint"
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == ["checkpoints", "last.ckpt"]


def test_usage_lines_name_the_command_as_it_was_called(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [str(REPO / "project" / "__main__.py")])
    assert "usage: python -m project [options] fit" in _refused(capsys, tmp_path / "run", "fit", "--no_such_flag")
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/project"])
    assert "usage: project [-c CONFIG] {fit,validate,test,predict}" in _refused(capsys, tmp_path / "run", "fiit")


def test_config_file_is_the_documented_default():
    assert DIGITS_CONFIG.is_file() and DIGITS_CONFIG.parent == REPO / "configs"


@pytest.mark.parametrize(
    ("flags", "key", "meant", "listing"),
    [
        (["--trainer.max_epohcs", "3"], "trainer.max_epohcs", "trainer.max_epochs", FIT_HELP),
        (["--config", "{typo_yaml}"], "trainer.max_epohcs", "trainer.max_epochs", FIT_HELP),
        (
            ["--data.init_args.batch_sise", "3"],
            "data.init_args.batch_sise",
            "data.init_args.batch_size",
            "python -m project fit --data.help project.data.DigitsDataModule",
        ),
        (
            ["--model.network.init_args.hiden_sizes", "[3]"],
            "model.network.init_args.hiden_sizes",
            "model.network.init_args.hidden_sizes",
            "python -m project fit --model.network.help project.networks.MLP",
        ),
    ],
    ids=["flag", "config-file", "data-class", "network-class"],
)
def test_a_mistyped_key_is_named_with_the_closest_valid_one_on_one_screen(
    capsys, monkeypatch, tmp_path, flags, key, meant, listing
):
    monkeypatch.setattr(sys, "argv", [str(REPO / "project" / "__main__.py")])
    typo_yaml = tmp_path / "typo.yaml"
    typo_yaml.write_text("trainer:\n  max_epohcs: 3\n")
    flags = [flag.format(typo_yaml=typo_yaml) for flag in flags]
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))
    assert f"error: unknown key {key}; did you mean {meant}? ({listing} lists them)" in stderr
    assert len(stderr.splitlines()) <= ONE_SCREEN, stderr  # not the subcommand's 70-line usage


class RefusingData(DigitsDataModule):
    """A data module whose constructor refuses its file, as a CSV data module does with an empty cell."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        raise ValueError("table.csv, row 3, column 'b': empty cell, expected a number")


def test_a_data_modules_own_exception_reaches_the_user_intact(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *quick_args(tmp_path / "run", "--data", f"{__name__}.RefusingData")])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2 and not (tmp_path / "run").exists()
    expected = f"error: {__name__}.RefusingData: table.csv, row 3, column 'b': empty cell, expected a number"
    assert expected in stderr
    assert "Union" not in stderr and "Namespace(" not in stderr and len(stderr.splitlines()) <= ONE_SCREEN


class FixedWidthHead(nn.Module):
    """A network that ignores num_classes: three outputs, whatever the data."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class FailsToTrain(nn.Module):
    """Evaluates, but fails at its first training step (as an out-of-memory error would)."""

    def __init__(self, num_classes: int, input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError("out of memory at the first step")
        return self.layers(x)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--model.network", f"{__name__}.FixedWidthHead"],
            "the network (FixedWidthHead) gives 3 outputs per sample, the data has 10 classes",
        ),
        (
            ["--model.network", TORCHVISION, "--model.network.init_args.name", "resnet18"],
            "torchvision's resnet18 takes 3-channel images, the data gives 1",
        ),
        (
            ["--model.network", TORCHVISION, "--model.network.init_args.name", "resnet81"],
            "'resnet81' is not a torchvision classification model; did you mean resnet18",
        ),
        (
            ["--model.network", "torchvision.models.resnet18"],
            "--model.network project.networks.TorchvisionModel --model.network.init_args.name resnet18",
        ),
    ],
    ids=["head-width", "channels", "unknown-name", "function"],
)
def test_a_network_that_does_not_fit_the_data_is_refused_before_a_run_starts(capsys, tmp_path, flags, message):
    if "torchvision" in " ".join(flags):
        pytest.importorskip("torchvision")
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))
    assert message in stderr and len(stderr.splitlines()) <= ONE_SCREEN, stderr


def write_images(root, sizes: list[int], classes: str = "ab"):
    """ROOT/train/<class>/<n>.png: random RGB images, one per size in SIZES for each of CLASSES."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for label in classes:
        (root / "train" / label).mkdir(parents=True)
        for number, size in enumerate(sizes):
            pixels = torch.randint(0, 256, (size, size, 3), generator=generator, dtype=torch.uint8).numpy()
            Image.fromarray(pixels).save(root / "train" / label / f"{number}.png")
    return root


@pytest.fixture(scope="module")
def tiny_images(tmp_path_factory):
    """Twelve 8x8 images of two classes, the folder every image test here shares."""
    pytest.importorskip("torchvision")
    return write_images(tmp_path_factory.mktemp("tiny_images"), [8] * 6)


def tiny_image_args(run_dir, root, *extra: str) -> list[str]:
    return quick_args(
        run_dir,
        *("--config", IMAGE_FOLDER_CONFIG, "--data.init_args.root", str(root), "--data.init_args.num_workers", "0"),
        *("--data.init_args.batch_size", "3", "--trainer.max_epochs", "1"),
        *("--trainer.log_every_n_steps", "1"),
        *extra,
    )


@pytest.mark.slow
def test_images_of_mixed_sizes_are_refused_before_a_run_with_the_option_that_resizes_them(capsys, tmp_path):
    pytest.importorskip("torchvision")
    root = write_images(tmp_path / "mixed", [8, 8, 12])
    stderr = _refused(capsys, tmp_path / "run", "fit", *tiny_image_args(tmp_path / "run", root))
    assert "images of different sizes" in stderr and "is 8x8" in stderr and "is 12x12" in stderr
    assert "--data.init_args.image_size" in stderr and len(stderr.splitlines()) <= ONE_SCREEN, stderr


@pytest.mark.slow
def test_a_network_that_cannot_take_the_datas_input_is_refused_with_the_shape(capsys, tmp_path, tiny_images):
    """squeezenet's pooling leaves nothing of an 8x8 image: said before training, with the shape."""
    flags = ("--model.network", TORCHVISION, "--model.network.init_args.name", "squeezenet1_0")
    stderr = _refused(capsys, tmp_path / "run", "fit", *tiny_image_args(tmp_path / "run", tiny_images, *flags))
    assert "the network (TorchvisionModel) cannot take one input of the data's shape (3, 8, 8)" in stderr


@pytest.fixture(scope="module")
def resnet_run(tiny_images, tmp_path_factory):
    """One epoch of torchvision's resnet18, by config, on the tiny image folder."""
    root = tmp_path_factory.mktemp("resnet")
    flags = ("--model.network", TORCHVISION, "--model.network.init_args.name", "resnet18")
    run_in_process("fit", *tiny_image_args(root, tiny_images, *flags, "--checkpoint.save_top_k", "0"))  # last.ckpt
    return root


@pytest.mark.slow
def test_a_torchvision_model_trains_by_config_with_the_datas_classes(resnet_run):
    checkpoint = torch.load(last_checkpoint(resnet_run), weights_only=True)
    assert checkpoint["global_step"] == 3  # 9 training images (12 less 1 val, 2 test) in batches of 3
    assert checkpoint["state_dict"]["network.model.fc.weight"].shape == (2, 512)  # two classes, linked
    assert checkpoint["hyper_parameters"]["network"]["init_args"]["name"] == "resnet18"


@pytest.mark.slow
@pytest.mark.parametrize(("command", "which"), [("test", "last"), ("fit", "auto")])
def test_ckpt_path_last_refuses_another_experiments_checkpoint_naming_the_run(
    capsys, resnet_run, tiny_images, command, which
):
    """Another experiment (the digits MLP) in the resnet's folder: the checkpoint found is refused, not loaded."""
    before = sorted(resnet_run.rglob("*"))
    with pytest.raises(SystemExit) as exit_info:
        main([command, *quick_args(resnet_run, "--ckpt_path", which)])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2
    run = run_folder(resnet_run, 0)
    assert f"--ckpt_path {which} found the run {run}, whose checkpoint {run / 'checkpoints' / 'last.ckpt'}" in stderr
    assert f"holds a {TORCHVISION}, the config's network is a project.networks.MLP" in stderr
    assert "Give each its own trainer.default_root_dir" in stderr
    assert sorted(resnet_run.rglob("*")) == before


@pytest.mark.slow
def test_ckpt_path_last_refuses_a_checkpoint_made_for_other_data_saying_what_differs(capsys, resnet_run, tmp_path):
    """The same network on three classes: the run found in the folder trained for two."""
    three_classes = write_images(tmp_path / "three", [8] * 4, classes="abc")
    flags = ("--model.network", TORCHVISION, "--model.network.init_args.name", "resnet18")
    with pytest.raises(SystemExit) as exit_info:
        main(["test", *tiny_image_args(resnet_run, three_classes, *flags, "--ckpt_path", "last")])
    stderr = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert f"--ckpt_path last found the run {run_folder(resnet_run, 0)}, whose checkpoint" in stderr
    assert "network.model.fc.weight is (2, 512) there, (3, 512) here" in stderr
    assert not run_folder(resnet_run, 1).exists()


@pytest.mark.slow
def test_a_run_that_fails_at_its_first_step_leaves_no_run_folder(resnet_run):
    """Nothing but its start files would be left: an empty run would be the newest, for --ckpt_path last."""
    before = sorted(resnet_run.rglob("*"))
    with pytest.raises(RuntimeError, match="out of memory at the first step"):
        run_in_process("fit", *quick_args(resnet_run, "--model.network", f"{__name__}.FailsToTrain"))
    assert sorted(resnet_run.rglob("*")) == before  # the earlier run is untouched, and no version_1


@pytest.mark.slow
def test_a_run_that_fails_at_its_first_step_into_a_new_root_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="out of memory at the first step"):
        run_in_process("fit", *quick_args(tmp_path / "run", "--model.network", f"{__name__}.FailsToTrain"))
    assert not (tmp_path / "run").exists()


def test_a_truncated_last_checkpoint_names_the_newest_intact_one_beside_it(capsys, tmp_path):
    """`--ckpt_path last` finds a last.ckpt cut short (a disk that filled, a copy cut short): the refusal names the
    newest checkpoint beside it that loads, to resume from instead."""
    folder = tmp_path / "run" / "lightning_logs" / "version_0" / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt", "last.ckpt"):
        torch.save({"state_dict": {"w": torch.ones(1000)}}, folder / name)
    (folder / "last.ckpt").write_bytes((folder / "last.ckpt").read_bytes()[:2000])
    os.utime(folder / "epoch=0-step=10.ckpt", (1, 1))  # older than step 20's
    stderr = _refused(capsys, tmp_path / "other", "fit", *quick_args(tmp_path / "run", "--ckpt_path", "last"))
    assert f"checkpoint {folder / 'last.ckpt'} is corrupted or truncated" in stderr
    assert f"the newest intact checkpoint beside it: --ckpt_path {folder / 'epoch=1-step=20.ckpt'}" in stderr
    assert len(stderr.splitlines()) <= ONE_SCREEN
