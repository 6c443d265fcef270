"""The settings Lightning accepts but cannot run with (trainfleet/checks.py): each refused with exit 2 and one line
naming the key, before anything starts or is written."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import quick_args, run_in_process
from test_cli_errors import ONE_SCREEN, _refused

from trainfleet import checks
from trainfleet.cli import build_cli


@pytest.fixture(autouse=True)
def bare_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["project"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--trainer.accumulate_grad_batches", "0"], "trainer.accumulate_grad_batches must be >= 1"),
        (["--trainer.log_every_n_steps", "-1"], "trainer.log_every_n_steps must be >= 0, got -1"),
        (["--trainer.gradient_clip_val", "-0.5"], "trainer.gradient_clip_val must be >= 0"),
        (["--seed_everything", "-3"], "seed_everything must be in [0, 4294967295]"),
        (["--seed_everything", str(2**32)], "(numpy's seed range), or true for a random one; got 4294967296"),
        (
            ["--trainer.max_epochs", "-1"],
            "give --trainer.max_steps N, --trainer.max_time DD:HH:MM:SS, or --model.scheduler.init_args.total_steps N",
        ),
        (
            ["--trainer.max_epochs", "-1", "--trainer.max_time", "00:00:01:00", "--model.scheduler_interval", "epoch"],
            "stepped per epoch (model.scheduler_interval epoch) needs the run's length in epochs",
        ),
        (
            ["--trainer.max_epochs", "-1", "--trainer.max_steps", "5", "--model.scheduler_interval", "epoch"],
            "needs the run's length in epochs: give --trainer.max_epochs N",
        ),
        (["--trainer.devices", "99"], "trainer.devices 99 starts 99 CPU processes on this host, which has"),
    ],
    ids=[
        "accumulate",
        "log-every",
        "clip",
        "seed-negative",
        "seed-too-big",
        "infinite",
        "max-time-epoch-schedule",
        "epoch-schedule",
        "cores",
    ],
)
def test_a_setting_lightning_would_fail_on_later_is_refused_now(capsys, tmp_path, flags, message):
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))
    assert message in stderr and len(stderr.splitlines()) <= ONE_SCREEN, stderr
    assert "Traceback" not in stderr


def test_a_modest_excess_of_processes_runs_with_a_note_and_one_that_cannot_work_is_refused(monkeypatch):
    """Up to 4 processes a core run (slower: each waits for a core); more, or more than the available memory holds
    at a rank's footprint, are refused; PROJECT_OVERSUBSCRIBE=1 insists past the refusal and silences the note."""
    monkeypatch.setattr(checks, "usable_cores", lambda: 2)
    monkeypatch.setattr(checks, "available_memory_mb", lambda: 16_000.0)
    monkeypatch.delenv(checks.OVERSUBSCRIBE_VAR, raising=False)
    assert checks.cpu_processes_problem(2) is None and checks.cpu_processes_note(2) is None
    assert checks.cpu_processes_problem(3) is None and checks.cpu_processes_problem(8) is None
    assert checks.cpu_processes_note(3).startswith("3 processes on 2 cores: each step waits for a core")
    problem = checks.cpu_processes_problem(9)
    assert "9 CPU processes on this host, which has 2 usable cores (at most 4 processes a core run)" in problem
    assert "give --trainer.devices 8 or fewer (2 is fastest), or set PROJECT_OVERSUBSCRIBE=1" in problem
    monkeypatch.setattr(checks, "available_memory_mb", lambda: 3.5 * checks.RANK_MEMORY_MB)
    assert "give --trainer.devices 3 or fewer, or set PROJECT_OVERSUBSCRIBE=1" in checks.cpu_processes_problem(4)
    monkeypatch.setattr(checks, "available_memory_mb", lambda: None)  # no /proc/meminfo: the cores' rule only
    assert checks.cpu_processes_problem(8) is None
    monkeypatch.setenv(checks.OVERSUBSCRIBE_VAR, "1")
    assert checks.cpu_processes_problem(99) is None and checks.cpu_processes_note(3) is None


def test_three_processes_on_two_cores_are_built_with_a_one_line_note(monkeypatch, capsys, tmp_path):
    """Through the parser and the CLI's checks, without running: refused before (exit 2), a note now."""
    monkeypatch.setattr(checks, "usable_cores", lambda: 2)
    monkeypatch.delenv(checks.OVERSUBSCRIBE_VAR, raising=False)
    build_cli([*quick_args(tmp_path / "run", "--trainer.devices", "3")], run=False)
    [note] = [line for line in capsys.readouterr().err.splitlines() if "processes on 2 cores" in line]
    assert note.startswith("[project] 3 processes on 2 cores: each step waits for a core")


def test_a_root_dir_under_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "afile").write_text("")
    root = tmp_path / "afile" / "runs"
    stderr = _refused(capsys, root, "fit", *quick_args(root))
    assert f"trainer.default_root_dir {root} cannot be made: {tmp_path / 'afile'} is a file" in stderr


@pytest.fixture
def read_only_folder(tmp_path):
    """A read-only file system (root ignores permission bits, not a read-only mount)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", folder]).returncode:
        folder.chmod(0o555)
        if os.access(folder, os.W_OK):
            pytest.skip("neither a read-only mount nor permissions can make a read-only folder here")
        yield folder
        folder.chmod(0o755)
        return
    yield folder
    subprocess.run(["umount", folder], check=True)


@pytest.mark.slow  # mount and umount are processes
def test_a_read_only_root_dir_is_refused_before_start(capsys, read_only_folder):
    root = read_only_folder / "runs"
    stderr = _refused(capsys, root, "fit", *quick_args(root))
    assert f"trainer.default_root_dir {root} is not writable ({read_only_folder} is read-only" in stderr


@pytest.mark.parametrize(
    ("flags", "steps"),
    [
        (["--trainer.max_steps", "6"], 6),
        (["--trainer.max_steps", "6", "--model.scheduler.init_args.warmup_steps", "2"], 6),
        (
            [
                "--trainer.max_time",
                "00:00:00:30",
                "--model.scheduler.init_args.total_steps",
                "6",
                "--trainer.max_steps",
                "6",
            ],
            6,
        ),
        (["--trainer.max_time", "00:00:00:30", "--trainer.max_steps", "4", "--model.scheduler", "null"], 4),
    ],
    ids=["max-steps", "warm-up", "total-steps", "no-schedule"],
)
def test_infinite_epochs_train_to_max_steps_with_the_schedule_fitted_to_them(tmp_path, flags, steps):
    run_in_process("fit", *quick_args(tmp_path / "run", "--trainer.max_epochs", "-1", *flags))
    [checkpoint] = (tmp_path / "run").rglob("last.ckpt")
    state = torch.load(checkpoint, weights_only=True)
    assert state["global_step"] == steps
    [scheduler] = state["lr_schedulers"] or [None]
    if scheduler is not None:
        assert scheduler["total_steps"] == 6 and scheduler["_last_lr"] == [0.0]  # the cosine's end, at the last step
