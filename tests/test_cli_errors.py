"""Bad input exits non-zero with a message that names the problem, before any process group starts, and
writes nothing. In-process: every refusal happens before Lightning launches a process."""

import sys

import pytest
import torch
import torch.distributed as dist
from conftest import DIGITS_CONFIG, REPO, quick_args

from project.__main__ import main


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
    ],
)
def test_bad_config_is_refused(capsys, tmp_path, flags, message):
    assert message in _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))


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
