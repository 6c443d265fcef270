"""A disk that fills while a checkpoint is saved: one line naming the file, the space left, the newest intact
checkpoint and the command that resumes; exit 4, which the self-healing restarts do not retry; nothing lost."""

import errno
import os
import subprocess

import pytest
import torch
from helpers import checkpoint_dir, exec_project, project_env, quick_args

from trainfleet import exit_codes
from trainfleet.checkpoints.files import AtomicCheckpointIO, DiskFullError, load_checkpoint_file
from trainfleet.runs import restarts

ONE_SCREEN = 25


def fill_disk_at_write(monkeypatch, after_bytes: int) -> None:
    """torch.save as it fails on a full disk: some bytes written, then ``RuntimeError ... unexpected pos`` raised while
    handling the write's ``OSError: [Errno 28]``."""

    def save(checkpoint, file):
        file.write(b"\0" * after_bytes)
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 43968 vs 43920") from None

    monkeypatch.setattr(torch, "save", save)


def test_a_save_that_fills_the_disk_names_the_file_the_space_and_the_intact_checkpoint(monkeypatch, tmp_path):
    last = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(10)}, "global_step": 20}, last)
    fill_disk_at_write(monkeypatch, 100)
    target = tmp_path / "epoch=1-step=40.ckpt"
    with pytest.raises(DiskFullError) as raised:
        AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(1000)}}, target)
    message = str(raised.value)
    assert message.startswith(f"disk full while saving {target}: ") and "left on its file system" in message
    assert "the checkpoint needs about 3.9 KB" in message and f"the newest intact checkpoint is {last}" in message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["last.ckpt"]  # no partial file left
    assert load_checkpoint_file(last)["global_step"] == 20
    assert exit_codes.exit_code_for(raised.value) == exit_codes.DISK_FULL_EXIT_CODE == 4
    assert exit_codes.DISK_FULL_EXIT_CODE in exit_codes.FINAL_EXIT_CODES  # never restarted: it would fill again


def test_a_full_disk_is_told_from_other_write_errors():
    assert exit_codes.is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not exit_codes.is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert exit_codes.exit_code_for(RuntimeError("unexpected pos")) == exit_codes.CRASHED_EXIT_CODE


@pytest.fixture
def tiny_disk(tmp_path):
    """A 400 KB file system: room for the digits run's first checkpoints, not for its second epoch's."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", disk]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", disk], check=True)


@pytest.mark.slow
def test_a_run_that_fills_its_disk_exits_4_on_one_screen_and_resumes_once_space_is_freed(tiny_disk, tmp_path):
    exit_file = tmp_path / "outcome.tsv"
    run_dir = tiny_disk / "run"
    env = project_env(**{restarts.EXIT_FILE_VAR: str(exit_file)})
    result = exec_project("fit", *quick_args(run_dir, "--trainer.max_epochs", "20"), cwd=tmp_path, env=env)
    assert result.returncode == exit_codes.DISK_FULL_EXIT_CODE, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) <= ONE_SCREEN, result.stderr
    folder = checkpoint_dir(run_dir)
    [line] = [line for line in result.stderr.splitlines() if "disk full while saving" in line]
    assert f"disk full while saving {folder}/" in line and "left on its file system" in line
    assert f"the newest intact checkpoint is {folder / 'last.ckpt'}" in line
    assert line.endswith("--ckpt_path last") and "once space is freed, resume with: python -m project fit" in line
    assert exit_file.read_text().startswith("4\t")
    assert not list(folder.glob(".*partial"))
    assert load_checkpoint_file(folder / "last.ckpt")["global_step"] == 20  # the first epoch's, intact
    subprocess.run(["mount", "-o", "remount,size=4m", tiny_disk], check=True)  # space freed
    resumed = exec_project(
        "fit", *quick_args(run_dir, "--trainer.max_epochs", "3", "--ckpt_path", "last"), cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert load_checkpoint_file(folder / "last.ckpt")["global_step"] == 60
