"""Real DDP runs (2 CPU processes, gloo) that fail or are preempted: no hang, no orphan, the failed rank named,
nothing lost.

Failures are injected by ``fault_injection.FailAt`` (tests/ is put on the children's PYTHONPATH).
"""

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
from fault_injection import FailAt
from helpers import (
    LIBRARY,
    REPO,
    assert_same_weights,
    checkpoint_dir,
    finish,
    free_port,
    last_checkpoint,
    logged_metrics,
    processes_left,
    project_env,
    quick_args,
    run_folder,
    run_in_process,
    run_project,
    start_python,
)
from lightning.pytorch.callbacks import ModelCheckpoint

from trainfleet.checkpoints.resume_state import ResumeState
from trainfleet.cli import build_cli
from trainfleet.exit_codes import (
    DETERMINISTIC_EXIT_CODE,
    INTERRUPTED_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    REFUSED_EXIT_CODE,
)
from trainfleet.runs.folders import resume_command
from trainfleet.runs.goodput import read_records
from trainfleet.runtime.early_interrupt import EarlyInterrupt
from trainfleet.runtime.faults import FailFast, Heartbeat, is_alive, pid_space, wait_until
from trainfleet.runtime.nan_guard import NaNGuard
from trainfleet.runtime.preemption import PreemptionCheck, requeue_slurm_job
from trainfleet.runtime.slow_rank import StepTimes
from trainfleet.runtime.throughput import Throughput

TESTS = str(LIBRARY / "tests")


def fit(run_dir: Path, *extra: str, timeout: float = 120, outcome: Path | None = None):
    """`fit` on 2 processes; returns the finished process and the seconds until every process had exited.

    stderr is a pipe every rank inherits, so the run returns only when the last rank has closed it.
    """
    start = time.monotonic()
    args = quick_args(run_dir, "--trainer.devices", "2", *extra)
    env = project_env(PYTHONPATH=TESTS, **({"PROJECT_EXIT_FILE": str(outcome)} if outcome else {}))
    result = run_project("fit", *args, cwd=REPO, env=env, timeout=timeout)
    return result, time.monotonic() - start


def fail_at(step: int, rank: int, action: str) -> list[str]:
    return [
        "--trainer.callbacks+=fault_injection.FailAt",
        *("--trainer.callbacks.step", str(step), "--trainer.callbacks.rank", str(rank)),
        *("--trainer.callbacks.action", action),
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rank", "action", "named"),
    [
        (1, "raise", "rank 1/2 failed at step 3: RuntimeError: injected failure on rank 1"),
        (1, "sigkill", "was killed by SIGKILL"),
        (0, "sigkill", "rank 0, the process that launched rank 1, is gone"),
    ],
    ids=["rank1-raises", "rank1-killed", "rank0-killed"],
)
def test_a_failed_rank_ends_every_process_quickly_and_is_named(tmp_path, rank, action, named):
    result, seconds = fit(tmp_path / "run", *fail_at(3, rank, action), "--trainer.max_epochs", "1")
    assert result.returncode != 0
    assert named in result.stderr
    if action == "sigkill" and rank == 1:
        assert re.search(r"rank 1 \(pid \d+\) was killed by SIGKILL", result.stderr)
    assert seconds < 60  # start-up included: a hang would wait for the 30-minute collective timeout
    assert processes_left(result) == []


@pytest.mark.slow
def test_a_nan_loss_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    exit_file = tmp_path / "outcome.tsv"
    result, _ = fit(tmp_path, "--model.optimizer.init_args.lr", "1000", "--trainer.max_epochs", "3", outcome=exit_file)
    assert result.returncode == DETERMINISTIC_EXIT_CODE == 3  # never restarted: it would fail again
    assert {line.split("\t")[0] for line in exit_file.read_text().splitlines()} == {"3"}  # what each rank recorded
    found = re.search(r"the training loss became NaN or inf at step (\d+)", result.stderr)
    assert found, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(tmp_path), weights_only=True)
    assert 0 < ckpt["global_step"] < int(found.group(1))
    assert all(value.isfinite().all() for value in ckpt["state_dict"].values())


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_the_nan_guard_refuses_to_save_non_finite_weights_naming_them(bad):
    trainer = SimpleNamespace(global_step=7)
    weights = {"a.weight": torch.ones(3), "b.weight": torch.tensor([1.0, bad]), "steps": torch.tensor([3])}
    with pytest.raises(FloatingPointError, match=r"non-finite weights at step 7 \(b\.weight\): not saving"):
        NaNGuard().check_weights(trainer, weights)
    NaNGuard().check_weights(trainer, {"a.weight": torch.ones(3), "empty": torch.zeros(0), "steps": torch.tensor([3])})


# Dropout draws random numbers every step: the resumed run must restore every rank's RNG states.
RESUMABLE = ("--trainer.max_epochs", "2", "--model.network.init_args.dropout", "0.3")
DATALOADER = ("--data.init_args.in_memory", "false", "--data.init_args.num_workers", "1")


class Uninterrupted(NamedTuple):
    weights: dict[str, torch.Tensor]
    logged: list[tuple[str, int]]  # (metric, step) in metrics.csv


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Uninterrupted:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result, _ = fit(run_dir, *RESUMABLE)
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(last_checkpoint(run_dir), weights_only=True)
    assert ckpt["global_step"] == 20  # 2 epochs of 10 steps (1258 samples, 2 ranks, batch 64)
    return Uninterrupted(ckpt["state_dict"], logged_metrics(run_dir))


def assert_same_end(uninterrupted: Uninterrupted, run_dir: Path) -> None:
    """RUN_DIR's one run ended at the uninterrupted run's step, with its weights bit for bit, and its metrics.csv
    holds each step once: the rows logged after the checkpoint it resumed from were dropped."""
    final = torch.load(last_checkpoint(run_dir), weights_only=True)
    assert final["global_step"] == 20 and len(list(run_dir.glob("lightning_logs/version_*"))) == 1
    assert_same_weights(final["state_dict"], uninterrupted.weights)
    assert logged_metrics(run_dir) == uninterrupted.logged


def assert_resumes_to(uninterrupted: Uninterrupted, run_dir: Path, *flags: str) -> None:
    """`fit --ckpt_path last` in RUN_DIR ends as the uninterrupted run (``assert_same_end``)."""
    resumed, _ = fit(run_dir, *RESUMABLE, *flags, "--ckpt_path", "last")
    assert_ends_as(uninterrupted, run_dir, resumed)


def assert_ends_as(uninterrupted: Uninterrupted, run_dir: Path, resumed: subprocess.CompletedProcess) -> None:
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_end(uninterrupted, run_dir)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("checkpointing", "kill_step", "resume_step"),
    [
        ((), 13, 10),  # the default, a checkpoint per epoch: resumes at the start of epoch 1
        (("--checkpoint.every_n_train_steps", "4"), 14, 12),  # resumes mid-epoch 1, at its third batch
        # The same through torchdata's StatefulDataLoader and a worker process: same batches, same weights.
        (("--checkpoint.every_n_train_steps", "4", *DATALOADER), 14, 12),
    ],
    ids=["after-an-epoch", "mid-epoch", "mid-epoch-dataloader"],
)
def test_a_killed_run_resumes_to_the_same_weights(uninterrupted, tmp_path, checkpointing, kill_step, resume_step):
    run_dir = tmp_path / "run"
    killed, _ = fit(run_dir, *RESUMABLE, *checkpointing, *fail_at(kill_step, -1, "sigkill"))
    assert killed.returncode == -9
    assert torch.load(last_checkpoint(run_dir), weights_only=True)["global_step"] == resume_step
    assert_resumes_to(uninterrupted, run_dir, *checkpointing)


@pytest.mark.slow
@pytest.mark.parametrize("signalled", [0, 1], ids=["rank0", "rank1"])
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step_saves_it_and_resumes_exactly(
    uninterrupted, tmp_path, signalled
):
    """Rank 0 launched rank 1 (Lightning's launcher); the flags are exchanged every 4 steps: SIGTERM after step 13
    stops both ranks after step 16, mid-epoch 1, with last.ckpt of step 16 and exit code 143 from every process."""
    run_dir = tmp_path / "run"
    check_every_4 = ("--preemption.check_every_n_steps", "4")
    stopped, seconds = fit(run_dir, *RESUMABLE, *check_every_4, *fail_at(13, signalled, "sigterm"))
    assert stopped.returncode == PREEMPTED_EXIT_CODE == 143, stopped.stderr[-3000:]
    for rank in (0, 1):
        assert f"[project] rank {rank}: SIGTERM on rank {signalled}: stopped at step 16" in stopped.stderr
    assert "exited with code" not in stopped.stderr  # rank 0 reports a launched rank that exits otherwise than 143
    assert "failed" not in stopped.stderr
    assert seconds < 60
    assert processes_left(stopped) == []
    assert torch.load(last_checkpoint(run_dir), weights_only=True)["global_step"] == 16
    assert_resumes_to(uninterrupted, run_dir)


# Ctrl-C. A test's child may start with SIGINT ignored, as a background job of a non-interactive shell does (pitfall
# 25): Python then never sees Ctrl-C. The runs go through this wrapper, which handles SIGINT as a Python started from
# a terminal does, then runs `python -m project ARGS`.
FROM_A_TERMINAL = (
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler);"
    " runpy.run_module('project', run_name='__main__', alter_sys=True)"
)
CHECK_EVERY_4 = ("--preemption.check_every_n_steps", "4")


def fit_with_ctrl_c(run_dir: Path, presses: int, to_group: bool, *extra: str, step: int = 13):
    """`fit` from a terminal: rank 0 pauses after step STEP (fault_injection.PauseAt) while the test presses Ctrl-C
    PRESSES times, 0.3 s apart: SIGINT to the launching process alone, or, TO_GROUP, to every process of the run as a
    terminal sends it (the run leads its own session and process group, tests/warm_start.py). Returns the run and the
    seconds from the last press until every process had exited."""
    pause = run_dir.parent / "pause"
    pause.mkdir()
    pause_at = ("--trainer.callbacks+=fault_injection.PauseAt", "--trainer.callbacks.step", str(step))
    args = quick_args(run_dir, *extra, *pause_at, "--trainer.callbacks.folder", str(pause))
    run = start_python("-c", FROM_A_TERMINAL, "fit", *args, cwd=REPO, env=project_env(PYTHONPATH=TESTS))
    deadline = time.monotonic() + 120
    while not (pause / "paused").exists():
        if time.monotonic() > deadline:
            run.kill()
            pytest.fail(f"the run never reached step {step}: {finish(run, 30).stderr[-3000:]}")
        time.sleep(0.05)
    for press in range(presses):
        time.sleep(0.3 if press else 0)  # apart: two signals before the handler runs would count once
        (os.killpg if to_group else os.kill)(run.pid, signal.SIGINT)
    pressed = time.monotonic()
    (pause / "go").touch()
    stopped = finish(run, timeout=120)
    return stopped, time.monotonic() - pressed


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [False, True], ids=["to-the-launcher", "to-the-process-group"])
def test_ctrl_c_stops_every_rank_at_one_step_saves_it_and_the_printed_command_resumes_exactly(
    uninterrupted, tmp_path, to_group
):
    """Ctrl-C after step 13 of a 2-process fit (epoch 1; 10 steps an epoch), flags exchanged every 4 steps: every rank
    stops after step 16, last.ckpt is of step 16, every process exits 130, and the printed command resumes to
    bit-identical weights. To the process group, through a DataLoader worker per rank, which gets Ctrl-C too."""
    run_dir = tmp_path / "run"
    loader = DATALOADER if to_group else ()
    stopped, _ = fit_with_ctrl_c(run_dir, 1, to_group, "--trainer.devices", "2", *RESUMABLE, *CHECK_EVERY_4, *loader)
    assert stopped.returncode == INTERRUPTED_EXIT_CODE == 130, stopped.stderr[-3000:]
    announced = "[project] Ctrl-C: every rank stops within 4 steps and saves last.ckpt; "
    announced += "Ctrl-C again to stop at once"
    assert stopped.stderr.count(announced) == 1
    signalled = "rank 0, rank 1" if to_group else "rank 0"
    for rank in (0, 1):
        assert f"[project] rank {rank}: Ctrl-C on {signalled}: stopped at step 16, saved" in stopped.stderr
    assert "failed" not in stopped.stderr and "exited with code" not in stopped.stderr
    assert processes_left(stopped) == []
    assert torch.load(last_checkpoint(run_dir), weights_only=True)["global_step"] == 16  # epoch 0 ended at 10
    command = shlex.split(re.search(r"\[project\] resume with: (.+)", stopped.stderr).group(1))
    assert command[:4] == ["python", "-m", "project", "fit"] and command[-2:] == ["--ckpt_path", "last"]
    resumed = run_project(*command[3:], cwd=REPO, env=project_env(PYTHONPATH=TESTS))
    assert_ends_as(uninterrupted, run_dir, resumed)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_every_process_at_once_without_saving(tmp_path):
    """Ctrl-C twice to the process group after step 13: no wait for the agreed step 16; every process ends, the run
    exits 130, last.ckpt stays the epoch-end one (step 10) and no partial file is left."""
    run_dir = tmp_path / "run"
    stopped, seconds = fit_with_ctrl_c(run_dir, 2, True, "--trainer.devices", "2", *RESUMABLE, *CHECK_EVERY_4)
    assert stopped.returncode == INTERRUPTED_EXIT_CODE, stopped.stderr[-3000:]
    assert "[project] rank 0: Ctrl-C again: stopped at step 13 without saving" in stopped.stderr
    assert "stopped at step 16" not in stopped.stderr and "failed" not in stopped.stderr
    assert seconds < 30  # a rank left waiting in a collective would hold the run for the 5-minute timeout
    assert processes_left(stopped) == []
    assert sorted(path.name for path in checkpoint_dir(run_dir).iterdir()) == ["epoch=0-step=10.ckpt", "last.ckpt"]
    assert torch.load(last_checkpoint(run_dir), weights_only=True)["global_step"] == 10
    resume = r"\[project\] resume from .*last\.ckpt with: python -m project fit .* --ckpt_path last"
    assert re.search(resume, stopped.stderr)


@pytest.mark.slow
def test_ctrl_c_stops_a_one_process_run_after_the_step_and_saves_it(tmp_path):
    """One process checks its flag after every step: Ctrl-C after step 5 stops it there."""
    stopped, _ = fit_with_ctrl_c(tmp_path / "run", 1, False, "--trainer.max_epochs", "1", step=5)
    assert stopped.returncode == INTERRUPTED_EXIT_CODE, stopped.stderr[-3000:]
    assert "[project] Ctrl-C: every rank stops after this step and saves last.ckpt" in stopped.stderr
    assert "[project] rank 0: Ctrl-C on this rank: stopped at step 5, saved" in stopped.stderr
    assert "[project] resume with: python -m project fit " in stopped.stderr
    assert torch.load(last_checkpoint(tmp_path / "run"), weights_only=True)["global_step"] == 5


def test_the_resume_command_is_the_command_with_ckpt_path_last_in_place_of_any_other():
    main = str(REPO / "project" / "__main__.py")
    assert (
        resume_command([main, "fit", "--config", "a b.yaml"])
        == "python -m project fit --config 'a b.yaml' --ckpt_path last"
    )
    started = ["/venv/bin/project", "fit", "--ckpt_path", "auto", "--trainer.devices", "2", "--ckpt_path=x.ckpt"]
    assert resume_command(started) == "project fit --trainer.devices 2 --ckpt_path last"


@pytest.mark.slow
def test_the_requeue_outlives_the_sigterm_it_brings_to_the_jobs_processes(tmp_path, monkeypatch):
    """`scontrol requeue` terminates the job's processes, its own among them: a stand-in that gets SIGTERM before
    it answers (as a busy CI machine's did) still reports the job requeued."""
    scontrol = tmp_path / "scontrol"
    scontrol.write_text('#!/bin/sh\nkill -TERM $$\necho "$@" > "$(dirname "$0")/asked"\n')
    scontrol.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    for name, value in (("SLURM_JOB_ID", "108"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_NAME", "project")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    assert requeue_slurm_job() == "108"
    assert (tmp_path / "asked").read_text() == "requeue 108\n"


def test_every_run_gets_the_safeguards_after_the_configs_callbacks_in_the_order_their_hooks_need(tmp_path, monkeypatch):
    """FailFast's on_exception before PreemptionCheck's (ranks stopped, then SIGINT's handler restored); the NaN check
    and the logs before the preemption stop; the NaN check before ResumeState's and ModelCheckpoint's saving."""
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # pytest's own arguments are not the CLI's
    cli = build_cli(quick_args(tmp_path, *fail_at(1000, 0, "raise")), run=False)
    kinds = [type(callback) for callback in cli.trainer.callbacks]
    order = [FailAt, FailFast, NaNGuard, Throughput, ResumeState, PreemptionCheck, ModelCheckpoint]
    assert [kind for kind in kinds if kind in order] == order
    assert cli.trainer.callbacks[kinds.index(PreemptionCheck)].check_every_n_steps == 50  # configs/digits.yaml


@pytest.mark.parametrize("switch", ["fail_fast", "nan_guard", "throughput", "resume_state"])
def test_each_safeguard_is_a_switch_that_turns_off_that_one_alone(tmp_path, monkeypatch, switch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    cli = build_cli(quick_args(tmp_path, f"--safeguards.{switch}", "false"), run=False)
    kinds = {type(callback) for callback in cli.trainer.callbacks}
    safeguards = {"fail_fast": FailFast, "nan_guard": NaNGuard, "throughput": Throughput, "resume_state": ResumeState}
    assert {kind for kind in safeguards.values() if kind in kinds} == set(safeguards.values()) - {safeguards[switch]}


@pytest.mark.slow
def test_a_fit_in_this_process_hands_ctrl_c_back_as_it_found_it_after_finishing_or_failing(tmp_path):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (pytest's may be ignored)
    try:
        run_in_process("fit", *quick_args(tmp_path / "finished", "--trainer.max_steps", "2"))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(RuntimeError, match="injected failure"):
            run_in_process("fit", *quick_args(tmp_path / "failed", "--trainer.max_steps", "3", *fail_at(2, 0, "raise")))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
@pytest.mark.parametrize("periodic", [(), ("--periodic.every", "1:00:00")], ids=["default", "periodic-checkpoint"])
def test_training_makes_no_per_step_collective(tmp_path, periodic):
    """Counted in each rank: the SIGTERM flags' all-reduce every 50 steps, nothing else (Lightning 2.6 alone makes
    one broadcast per step; the periodic checkpoint's clock rides on the same all-reduce). 100 steps of batch 4 stay
    inside the first epoch (158 steps)."""
    counter = ("--trainer.callbacks+=fault_injection.CountCollectives", "--trainer.callbacks.output_dir", str(tmp_path))
    steps = ("--trainer.max_steps", "101", "--data.init_args.batch_size", "4")
    result, _ = fit(tmp_path / "run", *steps, *counter, *periodic)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["steps"] == 100
        assert record["counts"] == {"all_reduce": 2}  # at steps 50 and 100
        assert sum(record["counts"].values()) / record["steps"] <= 0.1
    assert "is slow" not in result.stderr  # no rank slowed: none named (the step times ride on the same all-reduce)


SLOW_RANK_LINE = (
    r"\[project\] rank 1 \(host (\S+)\) is slow at step (\d+): ([\d.]+) ms of its own work a step"
    r" \(the wait for its batch and its forward\) against a median of ([\d.]+) ms on the other ranks"
    r" over the last 4 steps \(([\d.]+)x\)"
)


def test_a_slow_rank_is_named_after_two_checks_in_a_row_once_an_episode_and_never_for_noise():
    """The rule alone (µs a step for each rank): above 1.5x the others' median and 5 ms above it, twice in a row."""
    times = StepTimes()
    times.hosts = ["a", "b", "c"]
    assert times.judge([1000, 12000, 1100], 50, 50) == []  # the first slow check: a hiccup is not named
    [line] = times.judge([1000, 12300, 1100], 50, 100)
    assert line == (
        "rank 1 (host b) is slow at step 100: 12.3 ms of its own work a step (the wait for its batch and its forward)"
        " against a median of 1.1 ms on the other ranks over the last 50 steps (11.7x)"
    )
    [named] = times.named  # kept for the goodput record
    assert {key: named[key] for key in ("rank", "host", "step", "own_ms", "others_ms")} == {
        "rank": 1, "host": "b", "step": 100, "own_ms": 12.3, "others_ms": 1.05
    }  # fmt: skip
    assert times.judge([1000, 12000, 1100], 50, 150) == []  # the same episode: said once
    assert times.judge([1000, 1000, 1100], 50, 200) == []  # it ended
    assert times.judge([1000, 12000, 1100], 50, 250) == [] and len(times.judge([1000, 12000, 1100], 50, 300)) == 1
    assert len(times.named) == 2
    for _ in range(3):  # 4x the others, but only 3 ms above them: noise on a toy step
        assert times.judge([1000, 4000, 1000], 50, 350) == []


def test_the_step_times_are_kept_only_once_there_are_other_ranks_to_compare_with():
    def steps(count: int) -> None:
        for _ in range(count):
            times.batch_start(), time.sleep(0.002), times.before_backward(), times.batch_end()

    times = StepTimes()  # one process: no hosts gathered, no check to empty the window
    steps(3)
    assert times.window_microseconds() == 0
    times.hosts = ["a", "b"]
    steps(3)
    assert 2_000 <= times.window_microseconds() < 1_000_000 and times.window_microseconds() == 0  # emptied by the read


@pytest.mark.slow
@pytest.mark.parametrize(("slowed", "others"), [(0.02, 0.0), (0.04, 0.02)], ids=["5x", "2x"])
def test_a_rank_slow_on_every_step_is_named_once_with_its_host_by_the_periodic_exchange(tmp_path, slowed, others):
    """Rank 1 sleeps SLOWED at the start of every step, rank 0 OTHERS (the 2x case: 40 ms against 20 ms); the
    exchange every 4 steps carries each rank's own time a step (the wait for its batch plus its forward, not the
    backward where the ranks wait for each other): rank 1 is named at the second check (step 8) on an idle machine,
    once an episode, by rank 0, with its host, in the log and in the goodput record."""
    slow = ("--trainer.callbacks+=fault_injection.SlowRank", "--trainer.callbacks.seconds", str(slowed))
    slow += ("--trainer.callbacks.others", str(others))
    steps = ("--trainer.max_steps", "24", "--preemption.check_every_n_steps", "4")
    result, _ = fit(tmp_path / "run", *steps, *slow)
    assert result.returncode == 0, result.stderr[-3000:]
    named = re.findall(SLOW_RANK_LINE, result.stderr)
    # Printed by rank 0 alone, once a slow episode (the rule's test above); a window that the shared CPUs slowed on
    # rank 0 too could end an episode here and start another.
    assert 1 <= len(named) <= 3, result.stderr[-3000:]  # at most 3 episodes in 6 checks
    host, step, own, median, ratio = named[0]
    # Named at the second check (step 8) unless the shared CPUs slowed rank 0's window there too: a later check.
    assert host == socket.gethostname() and int(step) >= 8 and int(step) % 4 == 0
    assert float(own) >= slowed * 1e3 and float(own) - float(median) >= 5 and float(ratio) >= 1.5
    assert "rank 0 (host" not in result.stderr
    [record] = read_records(run_folder(tmp_path / "run"))
    first = record["slow_ranks"][0]
    assert (first["rank"], first["host"], first["step"]) == (1, host, int(step))
    seconds = first["at"] - record["first_step"]
    assert (int(step) - 1) * slowed <= seconds < 10  # rank 1's steps after rank 0's first, then the check
    print(f"rank 1 slowed {float(ratio):.1f}x ({own} ms against {median} ms): named at step {step}, {seconds:.2f} s")


@pytest.mark.slow
def test_a_hung_rank_is_killed_by_its_peers_on_its_machine_only():
    """Ranks 1, 2 and 3 stopped beating (their beats 10 s old); rank 1's pid is on this machine, rank 2's beat names
    another (its pid here belongs to an unrelated process, which must survive), rank 3 crashed (a zombie: not said to
    be killed); rank 0 beats."""
    hung, unrelated, ended = (subprocess.Popen(["sleep", seconds]) for seconds in ("60", "60", "0"))
    try:
        heartbeat, now = Heartbeat(), time.time()
        heartbeat._store = dist.HashStore()
        heartbeat._store.set("0", f"20 {now} {pid_space()} {os.getpid()}")
        heartbeat._store.set("1", f"18 {now - 10} {pid_space()} {hung.pid}")
        heartbeat._store.set("2", f"18 {now - 10} another-machine:1 {unrelated.pid}")
        heartbeat._store.set("3", f"18 {now - 10} {pid_space()} {ended.pid}")
        heartbeat._store.append("ranks", "0,1,2,3,")
        assert wait_until(lambda: not is_alive(ended.pid), timeout=10)  # sleep 0 has ended, and is not reaped yet
        assert heartbeat.kill_stopped_ranks_here(4) == [f"rank 1 (pid {hung.pid}, on this machine) killed: it hung"]
        assert hung.wait(timeout=10) == -signal.SIGKILL
        assert unrelated.poll() is None
        assert [line.partition(",")[0] for line in heartbeat.suspects(4)] == [
            *(f"rank {rank} stopped: its last heartbeat was at step 18" for rank in (1, 2, 3)),
            "ranks still running: 0 at step 20",
        ]
    finally:
        for process in (hung, unrelated, ended):
            process.kill()
            process.wait()


@pytest.mark.slow
def test_torchrun_restarts_a_rank_killed_then_hung_and_resumes_to_the_same_weights(uninterrupted, tmp_path):
    """scripts/torchrun.sh (2 workers, MAX_RESTARTS=2) with `--ckpt_path auto`: rank 1 is SIGKILLed at step 13, then
    SIGSTOPped (a hang) at step 18 of the restarted attempt; each worker forks its rank again each time (a warm
    restart: runtime/warm_restart.py), and the ranks resume from the newest checkpoint (every 4 steps) by themselves:
    the uninterrupted run's weights and logs, in one run folder. Rank 0 names the hung rank at the 10 s timeout and
    kills it: torchrun would give a stopped process 30 s to act on its SIGTERM."""
    root = tmp_path / "run"
    args = quick_args(root, *RESUMABLE, "--ckpt_path", "auto", "--checkpoint.every_n_train_steps", "4")
    for attempt, (step, action) in enumerate(((13, "sigkill"), (18, "sigstop"))):
        args += [*fail_at(step, 1, action), "--trainer.callbacks.attempt", str(attempt)]
    args += ["--trainer.strategy.init_args.timeout", "0:00:10"]
    env = project_env(PYTHONPATH=TESTS, DEVICES="2", MAX_RESTARTS="2", MASTER_PORT=str(free_port()))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the launcher calls torchrun
    launcher = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "torchrun.sh"), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = []  # (seconds, line) as they come
    try:
        for line in launcher.stderr:
            lines.append((time.monotonic(), line))
        assert launcher.wait(timeout=300) == 0, "".join(line for _, line in lines)[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    stderr = "".join(line for _, line in lines)
    assert "--ckpt_path auto: no checkpoint to resume, starting a new run" in stderr
    assert f"[project] resuming from {last_checkpoint(root)}" in stderr  # the restarts, in the same run
    restarts = (root / "lightning_logs" / "version_0" / "restarts.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in restarts] == ["torchrun restart 1", "torchrun restart 2"]
    assert restarts[1].startswith("torchrun restart 2: rank 1 stopped: its last heartbeat was at step "), restarts
    killed_at = next(at for at, line in lines if re.search(r"rank 0: rank 1 \(pid \d+, on this machine\) killed", line))
    resumed_at = next(at for at, line in lines if at > killed_at and "[project] resuming from" in line)
    assert resumed_at - killed_at < 10, stderr[-3000:]  # no wait for the launcher's grace (30 s), no new interpreter
    assert "[project] warm restart 1 of 2, in the same processes: rank 1 was killed by SIGKILL" in stderr
    assert "[project] warm restart 2 of 2, in the same processes: rank 1 stopped: its last heartbeat" in stderr
    assert_same_end(uninterrupted, root)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("MAX_RESTARTS", "three", "MAX_RESTARTS must be a non-negative integer"),
        ("CHECKPOINT_EVERY", "30m", "CHECKPOINT_EVERY must be a duration H:MM:SS"),  # periodic checkpoints
    ],
)
def test_a_launcher_setting_of_the_wrong_kind_is_refused_before_anything_starts(tmp_path, variable, value, message):
    for script in ("torchrun.sh", "slurm.sbatch"):
        env = project_env(**{variable: value}, SLURM_NNODES="1", SLURM_NTASKS_PER_NODE="1", SLURM_JOB_ID="1")
        result = subprocess.run(
            ["bash", str(REPO / "scripts" / script), *quick_args(tmp_path / "run")],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and f"'{value}'" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize("value", ["two", "0", "3"])
def test_a_min_nodes_that_cannot_work_is_refused_before_anything_starts(tmp_path, value):
    """MIN_NODES (elastic torchrun) is a whole number from 1 to NUM_NODES."""
    env = project_env(NUM_NODES="2", MIN_NODES=value, NODE_RANK="0", MASTER_ADDR="127.0.0.1")
    script = ["bash", str(REPO / "scripts" / "torchrun.sh"), *quick_args(tmp_path / "run")]
    result = subprocess.run(script, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert (
        result.returncode == 2
        and f"MIN_NODES must be an integer from 1 to NUM_NODES (2), got '{value}'" in result.stderr
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_refusal_under_torchrun_ends_the_job_at_once_with_its_own_code(tmp_path):
    """A rank's final code is not restarted, and the launcher ends with it, not with torchrun's 1 for any failure."""
    env = project_env(DEVICES="2", MASTER_PORT=str(free_port()))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the launcher calls torchrun
    args = [*quick_args(tmp_path / "run"), "--trainer.max_epochs", "many"]
    result = subprocess.run(["bash", str(REPO / "scripts" / "torchrun.sh"), *args], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "warm restart" not in result.stderr and "max_epochs" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_port_already_in_use_fails_fast_with_a_clear_error(tmp_path):
    """Another program listens at MASTER_PORT: rank 0 cannot serve the rendezvous there and says so; rank 1, which
    reached the other program, is stopped by rank 0 instead of waiting out the start-up timeout (2 minutes here)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        startup = ("--trainer.strategy.init_args.startup_timeout", "0:02:00")
        args = quick_args(tmp_path / "run", "--trainer.devices", "2", *startup)
        result = run_project("fit", *args, cwd=REPO, env=project_env(MASTER_PORT=str(port)), timeout=120)
    assert result.returncode == REFUSED_EXIT_CODE, result.stderr[-3000:]
    assert f"node 0 cannot listen at MASTER_PORT {port}: port {port} is already in use on this host" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.monotonic() - start < 60
    assert not (tmp_path / "run").exists()


def test_the_early_ctrl_c_watch_ends_and_gives_back_the_wakeup_fd_it_replaced(monkeypatch):
    """`main` in a notebook, whose event loop has a wakeup fd of its own: after the run, that fd is back."""
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.default_int_handler)  # as in a terminal
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    theirs = signal.set_wakeup_fd(writer.fileno())
    try:
        EarlyInterrupt.catch()
        assert EarlyInterrupt.armed
        EarlyInterrupt.disarm()
        assert not EarlyInterrupt.armed and signal.set_wakeup_fd(-1) == writer.fileno()
    finally:
        signal.set_wakeup_fd(theirs)
        reader.close(), writer.close()


@pytest.mark.slow
def test_ctrl_c_while_the_ranks_wait_for_a_peer_stops_every_process_at_once_with_130(tmp_path):
    """Node 0 of two, 2 processes, node 1 never starts: both ranks wait in the rendezvous (60 s here). Ctrl-C to the
    process group, as a terminal sends it: every process ends within seconds with exit 130, and nothing is written."""
    timeout = ("--trainer.strategy.init_args.startup_timeout", "0:01:00")
    args = quick_args(tmp_path / "run", "--trainer.num_nodes", "2", "--trainer.devices", "2", *timeout)
    env = project_env(NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    run = start_python("-c", FROM_A_TERMINAL, "fit", *args, cwd=REPO, env=env)
    deadline = time.monotonic() + 120
    while not run.stderr.exists() or "waiting for node rank 1" not in run.stderr.read_text():  # in the rendezvous
        assert time.monotonic() < deadline, "the ranks never reached the rendezvous"
        time.sleep(0.1)
    os.killpg(run.pid, signal.SIGINT)
    pressed = time.monotonic()
    stopped = finish(run, timeout=90)
    seconds = time.monotonic() - pressed
    assert stopped.returncode == INTERRUPTED_EXIT_CODE, stopped.stderr[-3000:]
    # The ranks wait in the store's C++ wait, where Python raises nothing: the early Ctrl-C watch ends each process.
    assert stopped.stderr.count("stopped at once, before training: nothing saved") >= 1, stopped.stderr[-3000:]
    assert seconds < 15
    assert processes_left(stopped) == []
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_rank_that_hangs_without_dying_is_named_within_the_timeout_with_the_stacks_of_the_others(tmp_path):
    """SIGSTOP to rank 1 at step 5 of 2 processes with a 20 s process-group timeout: rank 0 waits in the next
    gradient all-reduce, prints where it waits, fails at the timeout naming rank 1 and stops it."""
    timeout = ("--trainer.strategy.init_args.timeout", "0:00:20", "--trainer.max_epochs", "1")
    result, seconds = fit(tmp_path / "run", *fail_at(5, 1, "sigstop"), *timeout)
    assert result.returncode != 0
    assert re.search(r"rank 0: rank 1 stopped: its last heartbeat was at step \d, (1\d|2\d) s ago", result.stderr), (
        result.stderr[-3000:]
    )
    assert "ranks still running: 0 at step 5" in result.stderr
    assert re.search(r"rank 0: no progress for 1\d s at step 5; where each thread waits:", result.stderr)
    assert "most recent call first" in result.stderr  # faulthandler's stack of every thread of rank 0
    assert seconds < 20 + 30  # the timeout, plus start-up and the stop
    assert processes_left(result) == []
