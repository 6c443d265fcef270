"""One run, one writer: a run folder being trained in is held (runs/lock.py); a second fit on it is refused with one
line naming the holder and changes nothing; a holder that died is taken over; a finished fit says where it is."""

import errno
import os
import signal
import socket
import sys
import time

import pytest
from helpers import (
    LIBRARY,
    REPO,
    finish,
    project_env,
    quick_args,
    run_folder,
    run_in_process,
    run_project,
    start_python,
)

from trainfleet.runs import lock

TESTS = str(LIBRARY / "tests")


def in_child(body) -> tuple[int, int]:
    """Forks a process that runs BODY, then says so on a pipe and sleeps until killed; returns (its pid, the pipe)."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(reader)
            body()
            os.write(writer, b"ready")
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(writer)
    assert os.read(reader, 5) == b"ready"
    return pid, reader


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.slow  # forks
def test_a_held_run_folder_is_refused_naming_its_holder_then_taken_over_once_it_died(tmp_path, capsys):
    holder, pipe = in_child(lambda: lock.hold(tmp_path))
    try:
        with pytest.raises(lock.RunFolderHeld) as refused:
            lock.hold(tmp_path)
        message = str(refused.value)
        assert f"run folder {tmp_path} is being trained in by another process" in message
        assert f"host {socket.gethostname()}, pid {holder}, since " in message and " s ago)" in message
        assert "\n" not in message
    finally:
        kill(holder)
        os.close(pipe)
    assert (tmp_path / lock.LOCK_FILE).is_file()  # what the dead holder left: stale
    try:
        lock.hold(tmp_path)
        said = capsys.readouterr().err
        assert said.count("\n") == 1 and f"pid {holder}" in said and "ended without releasing it; taken over" in said
        assert lock.holds(tmp_path)
        assert (tmp_path / lock.LOCK_FILE).read_text().split()[:2] == [socket.gethostname(), str(os.getpid())]
    finally:
        lock.release()
    assert not (tmp_path / lock.LOCK_FILE).exists() and not lock.holds(tmp_path)


@pytest.mark.slow  # forks
def test_a_process_the_holder_forked_does_not_keep_the_lock_after_the_holder_ended(tmp_path):
    """A DataLoader worker or a local rank forked from the holder outlives it by seconds; a warm restart's next
    attempt (forked by the same supervisor) must find the folder free at once."""
    grandchild_pid = tmp_path / "grandchild"

    def hold_then_fork_and_die() -> None:
        lock.hold(tmp_path / "run")
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        grandchild_pid.write_text(str(pid))

    holder, pipe = in_child(hold_then_fork_and_die)
    forked = int(grandchild_pid.read_text())
    try:
        kill(holder)
        try:
            lock.hold(tmp_path / "run")  # the holder's child still lives
            assert lock.holds(tmp_path / "run")
        finally:
            lock.release()
    finally:
        os.kill(forked, signal.SIGKILL)
        os.close(pipe)


def test_only_the_runs_global_rank_0_on_the_first_node_owns_the_run_folder(monkeypatch):
    from lightning.pytorch.utilities import rank_zero_only

    for name in ("NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    assert lock.owns_runs()
    monkeypatch.setenv("NODE_RANK", "1")  # a multi-node launch without RANK: a local rank 0 on every node
    assert not lock.owns_runs()
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setattr(rank_zero_only, "rank", 3)
    assert not lock.owns_runs()


def test_a_file_system_without_locks_is_said_and_does_not_stop_the_run(tmp_path, monkeypatch, capsys):
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    lock.hold(tmp_path)
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "does not lock files (No locks available)" in said
    assert not lock.holds(tmp_path)


@pytest.mark.slow
def test_a_second_fit_on_a_run_folder_in_training_is_refused_and_a_dead_ones_is_taken_over(tmp_path):
    """`fit --ckpt_path last` twice on one run: before, the second ended in Lightning's RuntimeError about
    config.resume-2.yaml (started within seconds), or both trained in the same folder. The first pauses at step 25
    (fault_injection.PauseAt) while the second is refused; killed there, its lock file is left for the third."""
    root, pause = tmp_path / "runs", tmp_path / "pause"
    pause.mkdir()
    run_in_process("fit", *quick_args(root, "--trainer.max_epochs", "1"))
    folder = run_folder(root, 0)
    resume = quick_args(root, "--trainer.max_epochs", "3", "--ckpt_path", "last")
    paused = ("--trainer.callbacks+=fault_injection.PauseAt", "--trainer.callbacks.step", "25")
    first = start_python(
        "-m", "project", "fit", *resume, *paused, "--trainer.callbacks.folder", str(pause),
        cwd=REPO, env=project_env(PYTHONPATH=TESTS),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (pause / "paused").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (pause / "paused").exists(), "the first fit never reached step 25"
        host, pid, _ = (folder / lock.LOCK_FILE).read_text().split()
        before = {path.name: path.stat().st_mtime_ns for path in folder.rglob("*")}
        second = run_project("fit", *resume, cwd=REPO)
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.strip().splitlines() == [second.stderr.strip()]  # one line
        said = f"error: run folder {folder} is being trained in by another process (host {host}, pid {pid}, since "
        assert second.stderr.startswith(said)
        assert {path.name: path.stat().st_mtime_ns for path in folder.rglob("*")} == before  # nothing written
        assert not (folder / "config.resume-2.yaml").exists()
    finally:
        os.kill(int(pid), signal.SIGKILL)
        finish(first)
    assert (folder / lock.LOCK_FILE).is_file()  # left by the killed fit
    third = run_in_process("fit", *resume)
    assert f"its previous holder (host {host}, pid {pid}, since " in third and "taken over" in third
    last = folder / "checkpoints" / "last.ckpt"
    ended = [line for line in third.splitlines() if line.startswith("[project] fit ended")]
    assert len(ended) == 1, third[-3000:]
    where = f"run folder {folder}; last checkpoint {last}; "
    assert ended[0].startswith(f"[project] fit ended (3 epochs, 60 steps): {where}")
    assert " val_acc 0." in ended[0] and " val_loss " in ended[0]
    assert not (folder / lock.LOCK_FILE).exists()  # released at the end
    validated = run_in_process("validate", *quick_args(root, "--ckpt_path", "last"))
    assert f"[project] validate ended ({last}): val_acc 0." in validated


@pytest.mark.slow  # forks
def test_without_a_logger_a_fit_into_a_held_default_root_dir_is_refused(tmp_path, capsys, monkeypatch):
    """Without numbered run folders every fit trains in default_root_dir: held there, after every other refusal."""
    from trainfleet.main import main

    monkeypatch.setattr(sys, "argv", ["project"])  # LightningCLI warns when both sys.argv and args are given
    holder, pipe = in_child(lambda: lock.hold(tmp_path))
    saved_env = dict(os.environ)  # the Trainer's seeding sets PL_GLOBAL_SEED
    try:
        with pytest.raises(SystemExit) as refused:
            main(["fit", *quick_args(tmp_path, "--trainer.logger", "false")])
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        kill(holder)
        os.close(pipe)
    assert refused.value.code == 2
    assert f"run folder {tmp_path} is being trained in by another process (host " in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == [lock.LOCK_FILE]  # the holder's, nothing more
