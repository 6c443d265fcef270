"""The goodput record (trainfleet/runs/goodput.py) and ``python -m project report`` (trainfleet/commands/report.py): the
record's arithmetic and its file in this process; then a real fit, and a warm restart after rank 1 is SIGKILLed
(scripts/torchrun.sh, as tests/test_faults.py restarts one), whose record the report reads."""

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from helpers import LIBRARY, REPO, free_port, project_env, quick_args, run_folder, run_project

from trainfleet.commands import report
from trainfleet.exit_codes import REFUSED_EXIT_CODE
from trainfleet.runs import goodput, restarts
from trainfleet.runs.goodput import GOODPUT_FILE, Goodput, append_record, read_records, summarize
from trainfleet.runtime import warm_restart
from trainfleet.runtime.slow_rank import StepTimes

TESTS = str(LIBRARY / "tests")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KILL_STEP, CHECKPOINT_EVERY = 14, 4  # rank 1 is killed after step 14; last.ckpt is then step 12's
DETECTION_BOUND_S, RECOVERY_BOUND_S = 5.0, 60.0  # generous: 2 busy cores (docs: 0.2 s and 2.2 s unloaded)


def record(started: float, ended: float, training_s: float, steps: tuple[int, int], **extra: object) -> dict:
    return {
        "started": started,
        "first_step": started + 1.0,
        "ended": ended,
        "training_s": training_s,
        "start_step": steps[0],
        "end_step": steps[1],
        "outcome": "finished",
        "checkpoint_stalls": [],
        "restart": None,
        **extra,
    }


KILLED = {"what": "torchrun restart 1", "cause": "rank 1 was killed by SIGKILL", "failed_at": 109.9, "known_at": 110.1}
RESTARTED = [
    record(100.0, 110.0, 6.0, (0, 14), outcome="failed: RuntimeError", checkpoint_stalls=[[104.0, 0.25], [108, 0.5]]),
    record(110.5, 130.0, 12.0, (12, 40), first_step=113.5, checkpoint_stalls=[[120.0, 0.25]], restart=KILLED),
]


def test_the_runs_figures_add_up_over_its_attempts():
    summary = summarize(RESTARTED)
    assert summary.attempts == 2
    assert summary.wall_s == pytest.approx(30.0)  # the first start to the last end, the gap between attempts included
    assert summary.training_s == pytest.approx(18.0)
    assert summary.goodput == pytest.approx(0.6)
    [restart] = summary.restarts
    assert restart.cause == "rank 1 was killed by SIGKILL"
    assert restart.detection_s == pytest.approx(0.2)  # failed at 109.9, known at 110.1
    assert restart.recovery_s == pytest.approx(3.4)  # known at 110.1, the next attempt's first step at 113.5
    assert (summary.stall_count, summary.stall_s) == (3, pytest.approx(1.0))
    assert summary.steps_redone == 2  # step 14 reached, resumed from step 12


def test_a_restart_without_its_times_and_a_resume_from_the_newest_step_lose_nothing_unmeasured():
    resumed = record(200.0, 210.0, 5.0, (40, 60), restart={"what": "SLURM job 7, requeue 1", "cause": "requeued"})
    summary = summarize([record(100.0, 150.0, 20.0, (0, 40)), resumed])
    assert summary.steps_redone == 0
    assert (summary.restarts[0].detection_s, summary.restarts[0].recovery_s) == (None, None)
    assert goodput.one_line(summary) == "goodput 23% (training 25.0 s of 110.0 s wall; 1 restart: requeued)"


def test_a_lost_peers_cause_reads_without_torchs_source_location():
    location = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561]"
    cause = f"rank 0/3 failed at step 26: RuntimeError: {location} Connection closed by peer [10.55.0.3]:29363."
    lost = {"what": "torchrun restart 1", "cause": cause}
    line = goodput.one_line(summarize([record(100.0, 110.0, 5.0, (24, 40), restart=lost)]))
    assert "1 restart: rank 0/3 failed at step 26: RuntimeError: Connection clos...)" in line


def test_the_fits_last_line_says_it_all_in_one_line():
    line = goodput.one_line(summarize(RESTARTED))
    assert line == (
        "goodput 60% (training 18.0 s of 30.0 s wall; 1 restart: rank 1 was killed by SIGKILL, detected 0.2 s,"
        " recovered 3.4 s; checkpoint stalls 1.0 s; 2 steps redone)"
    )


def test_a_torn_line_loses_only_itself(tmp_path):
    append_record(tmp_path, RESTARTED[0])
    with open(tmp_path / GOODPUT_FILE, "a") as file:
        file.write('{"started": 110.5, "ended"')  # a process killed mid-write
    append_record(tmp_path, RESTARTED[1])
    assert read_records(tmp_path) == RESTARTED


def trainer_at(folder: Path, step: int, stalls: list, callbacks: list | None = None) -> SimpleNamespace:
    """What ``Goodput`` reads of a Trainer: rank 0, its step, its run folder (no logger), its checkpoint IO, its
    callbacks (the preemption check's step times)."""
    io = SimpleNamespace(stalls=stalls)
    strategy = SimpleNamespace(checkpoint_io=io)
    return SimpleNamespace(
        is_global_zero=True, global_step=step, loggers=[], default_root_dir=folder, strategy=strategy,
        callbacks=callbacks or [],
    )  # fmt: skip


def test_an_attempt_that_fails_appends_its_line_once_with_its_stalls_and_restart(tmp_path, monkeypatch):
    monkeypatch.setenv(restarts.FAILED_AT_VAR, "50.0")
    monkeypatch.setenv(restarts.KNOWN_AT_VAR, "50.25")
    stalls = [(10.0, 0.5)]  # a save before this attempt's training: not its own
    callback = Goodput(("torchrun restart 1", "rank 1 was killed by SIGKILL"))
    check = SimpleNamespace(step_times=StepTimes())  # what the preemption check holds
    check.step_times.hosts = ["a", "b"]
    trainer = trainer_at(tmp_path, 12, stalls, [callback, check])
    callback.on_train_start(trainer, None)
    for step in (13, 14):
        callback.on_train_batch_start(trainer, None)
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None)
    stalls.append((60.0, 0.125))
    for step in (13, 14):  # rank 1 slow at two checks in a row: named at the second
        check.step_times.judge([1000, 9000], 1, step)
    callback.on_exception(trainer, None, RuntimeError("Connection reset by peer"))
    callback.on_exception(trainer, None, RuntimeError("after the end"))  # once an attempt
    [line] = read_records(tmp_path)
    assert (line["start_step"], line["end_step"], line["outcome"]) == (12, 14, "failed: RuntimeError")
    assert line["checkpoint_stalls"] == [[60.0, 0.125]]
    assert line["restart"] == {
        "what": "torchrun restart 1", "cause": "rank 1 was killed by SIGKILL", "failed_at": 50.0, "known_at": 50.25
    }  # fmt: skip
    assert 0 < line["training_s"] <= line["ended"] - line["started"]
    assert line["started"] <= line["first_step"] <= line["ended"]
    [slow] = line["slow_ranks"]
    assert {key: slow[key] for key in ("rank", "host", "step", "own_ms", "others_ms")} == {
        "rank": 1, "host": "b", "step": 14, "own_ms": 9.0, "others_ms": 1.0
    }  # fmt: skip
    assert line["first_step"] <= slow["at"] <= line["ended"]


SLOW = {"rank": 1, "host": "node7", "step": 100, "own_ms": 40.5, "others_ms": 20.0, "at": 125.0}


def test_a_slow_rank_named_during_a_run_is_in_its_last_line_and_its_report(tmp_path, capsys):
    records = [RESTARTED[0], {**RESTARTED[1], "slow_ranks": [SLOW]}]
    assert goodput.one_line(summarize(records)).endswith("; slow: rank 1 (host node7) 2.0x the others from step 100)")
    three = [RESTARTED[0], {**RESTARTED[1], "slow_ranks": [SLOW, {**SLOW, "step": 200}, {**SLOW, "rank": 2}]}]
    assert goodput.one_line(summarize(three)).endswith("from step 200, and 1 more)")
    for line in records:
        append_record(tmp_path, line)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "timeline.png")]) == 0
    shown = capsys.readouterr().out
    assert (
        "rank 1 (host node7) 2.0x the others from step 100: 40.5 ms against 20.0 ms, named 11.50 s after its"
        " attempt's first step"  # the second attempt's first step was at 113.5
    ) in shown.splitlines()


def test_the_supervisor_hands_the_next_attempt_when_the_failure_began_and_when_it_knew(monkeypatch):
    for name in (restarts.FAILED_AT_VAR, restarts.KNOWN_AT_VAR):
        monkeypatch.setenv(name, "stale")  # restored after the test
    supervising = warm_restart.Supervisor(dist.HashStore(), budget=3)
    warm_restart._failed(supervising.store, 0, "rank 1/2 failed at step 9: ...", failed_at=40.0)  # a hang's start
    warm_restart._failed(supervising.store, 0, "rank 0 exited with code 1")  # later: neither cause nor time stand
    supervising.known_at[0] = 52.5
    supervising._pass_on_timing(0)
    assert (os.environ[restarts.FAILED_AT_VAR], os.environ[restarts.KNOWN_AT_VAR]) == ("40.0", "52.5")


def test_the_report_shows_the_records_figures_and_draws_a_bar_per_attempt(tmp_path, capsys):
    for line in RESTARTED:
        append_record(tmp_path, line)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "timeline.png")]) == 0
    assert_report_matches(capsys.readouterr().out, RESTARTED)
    assert_png(tmp_path / "timeline.png")


def test_the_timeline_splits_a_restarts_gap_between_the_failed_attempt_and_the_next_without_overlap():
    failed, restarted = (report.segments(*pair) for pair in ((RESTARTED[0], RESTARTED[1]), (RESTARTED[1], None)))
    assert failed[:3] == [("start-up", 100.0, 101.0), ("training", 101.0, 109.9), ("restart gap", 109.9, 110.0)]
    assert restarted[:2] == [("restart gap", 110.5, 113.5), ("training", 113.5, 130.0)]
    assert ("checkpoint stall", 120.0, 120.25) in restarted


def test_the_report_of_a_folder_without_a_record_is_one_line_and_exit_2(tmp_path, capsys):
    for folder, said in ((tmp_path / "missing", "no run folder"), (tmp_path, "has no goodput record")):
        assert report.main([str(folder)]) == REFUSED_EXIT_CODE
        err = capsys.readouterr().err
        assert err.startswith(f"error: {folder}" if folder == tmp_path else "error: no run folder"), err
        assert said in err and err.count("\n") == 1


def assert_report_matches(table: str, records: list[dict]) -> None:
    """TABLE (the report's output) holds the summary's figures and each restart's, as the report rounds them."""
    summary = summarize(records)
    for line in report.totals(summary):
        assert line in table.splitlines()
    assert f"goodput            {summary.goodput:.1%}" in table
    for number, restart in enumerate(summary.restarts, start=1):
        row = next(line for line in table.splitlines() if re.match(rf"{number} +[\d.-]+ +[\d.-]+ +\S", line))
        assert row.split()[1:3] == [f"{restart.detection_s:.2f}", f"{restart.recovery_s:.2f}"]
        assert restart.cause in row
    for record_ in records:
        assert f"{record_['training_s']:10.2f}" in table


def assert_png(path: Path) -> None:
    from matplotlib.image import imread  # the plot extra: only where a test draws

    assert path.read_bytes()[:8] == PNG_MAGIC
    image = imread(path)
    assert image.shape[0] > 50 and image.shape[1] > 200


@pytest.fixture(scope="module")
def plain_fit(tmp_path_factory) -> tuple[Path, str]:
    """A short one-process fit: its run folder and what it printed."""
    root = tmp_path_factory.mktemp("plain")
    result = run_project("fit", *quick_args(root, "--trainer.max_epochs", "1"), cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_folder(root), result.stderr


@pytest.mark.slow
def test_a_fit_writes_its_record_and_ends_on_its_goodput_line(plain_fit):
    folder, stderr = plain_fit
    [line] = read_records(folder)
    summary = summarize([line])
    assert 0 < summary.training_s <= summary.wall_s
    assert 0 < summary.goodput <= 1
    assert (summary.restarts, summary.steps_redone, line["outcome"]) == ([], 0, "finished")
    assert (line["start_step"], line["end_step"]) == (0, 20)  # 1 epoch of 20 steps on one process
    assert summary.stall_count >= 1  # the epoch's checkpoint (last.ckpt beside it)
    [said] = [text for text in stderr.splitlines() if text.startswith("[project] goodput ")]
    assert said == f"[project] {goodput.one_line(summary)}"
    assert stderr.rstrip().endswith(said)  # the fit's last line


@pytest.fixture(scope="module")
def restarted_fit(tmp_path_factory) -> tuple[Path, str]:
    """scripts/torchrun.sh, 2 workers, warm restarts: rank 1 SIGKILLed after step KILL_STEP of the first attempt, the
    next attempt resumed from the newest checkpoint (every CHECKPOINT_EVERY steps). Its run folder and stderr."""
    root = tmp_path_factory.mktemp("restarted")
    args = quick_args(
        root, "--trainer.max_epochs", "2", "--ckpt_path", "auto",
        "--checkpoint.every_n_train_steps", str(CHECKPOINT_EVERY), "--trainer.callbacks+=fault_injection.FailAt",
        "--trainer.callbacks.step", str(KILL_STEP), "--trainer.callbacks.rank", "1",
        "--trainer.callbacks.action", "sigkill", "--trainer.callbacks.attempt", "0",
    )  # fmt: skip
    env = project_env(PYTHONPATH=TESTS, DEVICES="2", MAX_RESTARTS="1", MASTER_PORT=str(free_port()))
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # the launcher calls torchrun
    launcher = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "torchrun.sh"), *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _, stderr = launcher.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, stderr[-3000:]
    return run_folder(root), stderr


@pytest.mark.slow
def test_a_warm_restart_is_in_the_record_with_its_cause_its_times_and_the_steps_redone(restarted_fit):
    folder, stderr = restarted_fit
    first, second = records = read_records(folder)
    assert first["outcome"].startswith("failed: ")  # rank 0's collective with the killed rank (a RuntimeError)
    assert (first["start_step"], first["end_step"]) == (0, KILL_STEP)
    resumed_at = KILL_STEP // CHECKPOINT_EVERY * CHECKPOINT_EVERY
    assert (second["outcome"], second["start_step"], second["end_step"]) == ("finished", resumed_at, 20)
    summary = summarize(records)
    [restart] = summary.restarts
    assert restart.cause == "rank 1 was killed by SIGKILL"
    assert second["restart"]["what"] == "torchrun restart 1"  # as restarts.txt counts it
    assert (folder / "restarts.txt").read_text() == "torchrun restart 1: rank 1 was killed by SIGKILL\n"
    assert 0 < restart.detection_s < DETECTION_BOUND_S, restart
    assert 0 < restart.recovery_s < RECOVERY_BOUND_S, restart
    assert summary.steps_redone == KILL_STEP - resumed_at == 2
    assert 0 < summary.training_s <= summary.wall_s and 0 < summary.goodput <= 1
    assert summary.stall_count >= 4  # every 4 steps and each epoch's end, in both attempts (the background writer)
    assert f"[project] {goodput.one_line(summary)}" in stderr.splitlines()
    print(goodput.one_line(summary))  # the measured figures, with -s


@pytest.mark.slow
def test_the_report_of_the_restarted_run_shows_its_record_and_draws_its_timeline(restarted_fit, capsys):
    folder, _ = restarted_fit
    assert report.main([str(folder)]) == 0
    table = capsys.readouterr().out
    assert_report_matches(table, read_records(folder))
    assert "torchrun restart 1: rank 1 was killed by SIGKILL" in table
    assert_png(folder / "goodput.png")
