"""scripts/slurm.sbatch on a real SLURM cluster: two nodes on this machine (tests/fixtures/slurm_cluster.sh), the
scheduler's srun starting one task per node, its signals, requeues and job arrays. Every run resumed after the scheduler
stopped it must end with the weights of the uninterrupted run."""

import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from helpers import (
    LIBRARY,
    REPO,
    assert_same_weights,
    last_checkpoint,
    last_weights,
    logged_metrics,
    metric_values,
    metrics_rows,
    run_folder,
    run_project,
    saved_step,
)
from sample_accounting import kept_samples
from slurm_cluster import (  # noqa: F401 (slurm_cluster: the fixture)
    job_output,
    job_state,
    release_when_requeued,
    sbatch,
    slurm_cluster,
    slurm_env,
    wait_job,
)

from trainfleet.runs.goodput import one_line, read_records, summarize

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

TESTS = str(Path(__file__).parent)
SBATCH_SCRIPT = REPO / "scripts" / "slurm.sbatch"
DIGITS_CONFIG = REPO / "configs" / "digits.yaml"
EPOCHS = 30
NODES = 2
BATCH_SIZE = 64  # configs/digits.yaml's
# Digits: 1797 samples; validation round(0.1 * 1797) = 180, test round(0.2 * 1797) = 359, training the 1258 left.
TRAIN_SAMPLES = 1797 - round(0.1 * 1797) - round(0.2 * 1797)
# Each rank gets ceil(1258 / 2) = 629 samples from the DistributedSampler: ceil(629 / 64) = 10 steps per epoch.
STEPS_PER_EPOCH = math.ceil(math.ceil(TRAIN_SAMPLES / NODES) / BATCH_SIZE)
CHECK_EVERY = 50  # preemption.check_every_n_steps in configs/digits.yaml
# The sbatch line of docs/multi-node.md, as written: its options and the script's arguments.
[DOCUMENTED] = [
    line for line in (LIBRARY / "docs" / "multi-node.md").read_text().splitlines() if line.startswith("sbatch ")
]
DOC_OPTIONS, DOC_ARGS = (part.split() for part in DOCUMENTED.removeprefix("sbatch ").split(" scripts/slurm.sbatch "))


def slow(seconds: float) -> tuple[str, ...]:
    """A job slowed down after every step on its first attempt (fault_injection.SlowSteps), so that the scheduler's
    signal reaches it mid-training; the numbers are those of a job at full speed."""
    return ("--trainer.callbacks+=fault_injection.SlowSteps", "--trainer.callbacks.seconds", str(seconds))


def submit(out: Path, run_dir: Path, *options: str, fit: tuple[str, ...] = (), nodes: int = NODES, **env: str) -> str:
    """docs/multi-node.md's `sbatch` line with OPTIONS added and FIT after its arguments, into RUN_DIR, with ENV for
    the sbatch script; the job id."""
    resources = [option if not option.startswith("--nodes=") else f"--nodes={nodes}" for option in DOC_OPTIONS]
    return sbatch(
        *resources,
        f"--output={out}/slurm-%j.out",
        *options,
        str(SBATCH_SCRIPT),
        *DOC_ARGS,
        *("--trainer.max_epochs", str(EPOCHS)),
        *("--trainer.default_root_dir", str(run_dir), "--trainer.enable_progress_bar", "false"),
        *fit,
        cwd=REPO,
        env=slurm_env(PYTHONPATH=TESTS, PROJECT_EXIT_DIR=str(out), **env),
    )


def finished(job: str, out: Path, timeout: float = 300) -> tuple[dict, str]:
    state = wait_job(job, timeout=timeout)
    return state, job_output(out / f"slurm-{job}.out")


def logged_steps(run_dir: Path) -> list[int]:
    return [int(row["step"]) for row in metrics_rows(run_folder(run_dir)) if row.get("train_loss")]


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.2)


def stop_lines(text: str) -> dict[int, int]:
    """{rank: the step it stopped at} from the ranks' preemption reports."""
    found = re.findall(r"\[project\] rank (\d): .* stopped at step (\d+)", text)
    return {int(rank): int(step) for rank, step in found}


@pytest.fixture(scope="module")
def reference(slurm_cluster, tmp_path_factory):  # noqa: F811 (the fixture, imported)
    """The uninterrupted 2-node run every interrupted one must end up equal to."""
    out = tmp_path_factory.mktemp("reference")
    job = submit(out, out / "run")
    state, text = finished(job, out)
    return out / "run", state, text


def test_a_two_node_job_trains_one_rank_per_node(reference):
    run_dir, state, text = reference
    assert (state["state"], state["exit_code"], state["signal"]) == ("COMPLETED", 0, 0), f"{state}\n{text[-4000:]}"
    assert state["nodes"] == "node[1-2]", state
    assert set(re.findall(r"GLOBAL_RANK: (\d), MEMBER: \d/(\d)", text)) == {("0", "2"), ("1", "2")}, text[-4000:]
    checkpoint = torch.load(last_checkpoint(run_dir), map_location="cpu", weights_only=True)
    assert STEPS_PER_EPOCH == 10 and checkpoint["global_step"] == EPOCHS * STEPS_PER_EPOCH


def test_a_job_that_reaches_its_time_limit_is_requeued_and_loses_nothing(reference, tmp_path):
    """`--time=2 --signal=USR1@80`: SLURM signals every task before the limit; every rank stops at the next agreed step,
    rank 0 saves last.ckpt and requeues the job, which resumes its own run.

    SLURM's timer fires every 30 s and signals once the time left is within the lead plus 30 s: here 10-40 s into the
    job, after srun has started the tasks (a signal before there is a task to receive it is lost) and before the slowed
    first run (45 s of steps) ends. `--time=1 --signal=USR1@30` would signal 0-30 s in, at times before any task."""
    run_dir = tmp_path / "run"
    job = submit(tmp_path, run_dir, "--time=2", "--signal=USR1@80", fit=slow(0.15))
    # One requeue is the test: the resumed run gets the time to finish, whatever the machine's load (a second time-limit
    # signal would stop it again, at the scheduler's whim).
    release_when_requeued(job, 1, 180, "TimeLimit=5")
    state, text = finished(job, tmp_path)
    assert (state["state"], state["exit_code"]) == ("COMPLETED", 0), f"{state}\n{text[-4000:]}"
    assert state["restarts"] >= 1
    stops = stop_lines(text)
    assert set(stops) == {0, 1} and len(set(stops.values())) == 1, text[-4000:]  # both ranks, one step
    assert f"job {job} requeued: it resumes by itself" in text, text[-4000:]
    assert f"SLURM job {job}, requeued 1 time(s): resuming from" in text
    checkpoint = torch.load(last_checkpoint(run_dir), map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == EPOCHS * STEPS_PER_EPOCH  # not one optimizer step lost
    assert_same_weights(last_weights(run_dir), last_weights(reference[0]))
    assert [path.name for path in (run_dir / "lightning_logs").iterdir()] == ["version_0"]  # one run folder
    steps = logged_steps(run_dir)
    assert len(steps) == len(set(steps)) and steps  # no step logged twice


def stopped_once(text: str) -> int:
    """The one step every rank of a job's run stopped at, from the ranks' preemption reports in TEXT."""
    stops = stop_lines(text)
    assert set(stops) == {0, 1} and len(set(stops.values())) == 1, text[-4000:]  # every rank, the same step
    [step] = set(stops.values())
    assert step % CHECK_EVERY == 0 and 0 < step < EPOCHS * STEPS_PER_EPOCH, step
    return step


def test_a_job_scontrol_requeues_saves_the_step_every_rank_stopped_at_and_resumes_by_itself(reference, tmp_path):
    run_dir = tmp_path / "run"
    job = submit(tmp_path, run_dir, "--requeue", fit=slow(0.05))
    wait_for(run_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt")  # training is under way
    subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
    release_when_requeued(job)
    state, text = finished(job, tmp_path)
    stopped_once(text)
    assert (state["state"], state["exit_code"], state["restarts"]) == ("COMPLETED", 0, 1), state
    assert_same_weights(last_weights(run_dir), last_weights(reference[0]))
    assert [path.name for path in (run_dir / "lightning_logs").iterdir()] == ["version_0"]


def test_jobs_scancel_stops_save_the_step_every_rank_stopped_at_and_resume_with_ckpt_path_last(reference, tmp_path):
    """One run stopped twice: `scancel --signal=TERM` (the job ends FAILED with 143), then, resubmitted with
    `--ckpt_path last`, plain `scancel` (CANCELLED); each time last.ckpt holds the step every rank stopped at, and the
    third submission ends with the uninterrupted run's weights, in the same run folder."""
    run_dir, steps = tmp_path / "run", []
    slowed = (*slow(0.05), "--trainer.callbacks.first_attempt_only", "false")
    for command, ended in ((["scancel", "--signal=TERM"], ("FAILED", 143)), (["scancel"], ("CANCELLED",))):
        job = submit(tmp_path, run_dir, fit=(*slowed, "--ckpt_path", "last") if steps else slowed)
        wait_for_step(run_dir, (steps[-1] if steps else 0) + 1)  # this job's training is under way
        signalled = time.monotonic()
        subprocess.run([*command, job], check=True, capture_output=True)
        state, text = finished(job, tmp_path)
        print(f"{' '.join(command)}: job ended {time.monotonic() - signalled:.1f} s after the signal: {state}")
        steps.append(stopped_once(text))
        assert (state["state"], state["exit_code"])[: len(ended)] == ended, state
        assert saved_step(run_dir) == steps[-1]  # last.ckpt: that step
    assert steps[0] < steps[1]
    resumed = submit(tmp_path, run_dir, fit=("--ckpt_path", "last"))
    state, text = finished(resumed, tmp_path)
    assert (state["state"], state["exit_code"]) == ("COMPLETED", 0), f"{state}\n{text[-4000:]}"
    assert_same_weights(last_weights(run_dir), last_weights(reference[0]))
    assert [path.name for path in (run_dir / "lightning_logs").iterdir()] == ["version_0"]


def test_a_node_whose_tasks_are_killed_ends_the_job_quickly(slurm_cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    job = submit(tmp_path, run_dir, fit=slow(0.05))
    wait_for(run_dir / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt")
    killed = time.monotonic()
    subprocess.run(["scancel", "--signal=KILL", "--nodelist=node2", job], check=True, capture_output=True)
    state, text = finished(job, tmp_path, timeout=120)
    seconds = time.monotonic() - killed
    print(f"one node's tasks killed: the job ended {seconds:.1f} s later: {state}")
    # scancel with --nodelist cancels the job here (every task gets SIGTERM, saves and exits 143): not a success.
    assert state["state"] in ("FAILED", "CANCELLED") and (state["exit_code"], state["signal"]) != (0, 0), state
    assert seconds < 30  # srun --kill-on-bad-exit ends the other node's rank: no wait for a collective timeout


def test_jobs_of_an_array_started_together_get_their_own_run_folders(slurm_cluster, tmp_path):  # noqa: F811
    run_dir = tmp_path / "shared"
    array = submit(tmp_path, run_dir, "--array=0-2", nodes=1, fit=("--trainer.max_epochs", "1"))
    jobs = [f"{array}_{task}" for task in range(3)]
    states = [wait_job(job, timeout=300) for job in jobs]
    assert [state["state"] for state in states] == ["COMPLETED"] * 3, states
    folders = sorted((run_dir / "lightning_logs").iterdir())
    assert [folder.name for folder in folders] == ["version_0", "version_1", "version_2"]
    assert sorted((folder / "slurm_job.txt").read_text().strip() for folder in folders) == jobs
    assert all((folder / "checkpoints" / "last.ckpt").is_file() for folder in folders)


def test_a_sweep_runs_its_trials_as_a_job_array_and_its_best_config_reruns(slurm_cluster, tmp_path):  # noqa: F811
    storage = f"sqlite:///{tmp_path}/sweep.db"
    options = f"--nodes=1 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1 --output={tmp_path}/sweep-%A_%a.out"
    fit = ["--config", str(DIGITS_CONFIG), "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false"]
    sweep = [sys.executable, "-m", "project", "sweep", "--space", str(REPO / "configs" / "sweep.yaml")]
    sweep += ["--trials", "2", "--slurm-array", "2", "--sbatch", options, "--no-prune", "--storage", storage]
    done = subprocess.run(
        [*sweep, "--root", str(tmp_path / "runs"), "--", *fit],
        cwd=REPO,
        env=slurm_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    study = optuna.load_study(study_name="sweep", storage=storage)
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(study.trials) == 2 and len(trials) == 2
    spans = sorted((trial.datetime_start, trial.datetime_complete) for trial in trials)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))  # 2 ran at once
    best = tmp_path / "runs" / "sweep" / "best.yaml"
    assert yaml.safe_load(best.read_text())["trainer"]["max_epochs"] == 2
    rerun = run_project("fit", "--config", str(best), "--trainer.default_root_dir", str(tmp_path / "rerun"), cwd=REPO)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    [*_, last] = metric_values(run_folder(tmp_path / "rerun"), "val_acc")
    assert last == pytest.approx(study.best_value, abs=1e-6)


def task_pid(job: str, rank: int) -> int:
    """The pid of rank RANK's `python -m project` in JOB (the test cluster's nodes are all this machine): the
    rank its task's process forked (runtime/warm_restart.py), not that process."""
    found = {}  # pid: parent pid
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            argv = (environ.parent / "cmdline").read_bytes().split(b"\0")
            env = environ.read_bytes().split(b"\0")
            parent = int((environ.parent / "stat").read_text().rpartition(")")[2].split()[1])
        except OSError:
            continue
        wanted = {f"SLURM_JOB_ID={job}".encode(), f"SLURM_PROCID={rank}".encode()}
        if argv[1:3] == [b"-m", b"project"] and wanted <= set(env):
            found[int(environ.parent.name)] = parent
    forked = [pid for pid, parent in found.items() if parent in found]
    if not forked:
        pytest.fail(f"no rank {rank} of job {job} running: {found}")
    return forked[0]


def wait_for_step(run_dir: Path, step: int, timeout: float = 120) -> float:
    """Waits until the run has saved STEP or a later one; returns when it did (``time.monotonic()``)."""
    deadline = time.monotonic() + timeout
    while saved_step(run_dir) < step:
        assert time.monotonic() < deadline, f"the run never saved step {step} (at {saved_step(run_dir)})"
        time.sleep(0.2)
    return time.monotonic()


def set_node(node: str, state: str) -> None:
    """DOWN, DRAIN (kept out of new jobs: a DOWN node comes back as soon as its slurmd answers, ReturnToService=2), or
    RESUME (refused when the node is back already)."""
    reason = ["Reason=chaos test"] if state in ("DOWN", "DRAIN") else []  # RESUME takes none
    subprocess.run(["scontrol", "update", f"NodeName={node}", f"State={state}", *reason], check=state != "RESUME")


def test_a_job_hit_by_every_fault_heals_itself_and_ends_as_the_uninterrupted_one(reference, tmp_path):
    """docs/multi-node.md's sbatch line, one job hit in turn by: SIGKILL of rank 1 (srun restarts the step in the
    allocation), SIGSTOP of rank 1 (rank 0 fails at the 10 s process-group timeout naming it; restarted), SLURM's
    time-limit signal (saved, requeued, resumed) and node2 taken down, then brought back (SLURM requeues the job).
    It ends COMPLETED at the uninterrupted job's step with its weights, in one run folder, each step logged once."""
    run_dir = tmp_path / "run"
    fit = (*slow(0.05), "--trainer.callbacks.first_attempt_only", "false")
    # A stop every 9 steps of an attempt: never at an epoch's last step here (see the report on such resumes).
    fit += ("--preemption.check_every_n_steps", "9")
    fit += ("--trainer.strategy.init_args.timeout", "0:00:10")
    started, recovered = time.monotonic(), {}

    def hit(fault: str, at_step: int, action: Callable[[], None]) -> None:
        """ACTION once the run has saved AT_STEP; then the seconds until the restarted run saves a step after the one
        it resumed from (its first training steps after the recovery, plus at most one epoch of 10 steps)."""
        wait_for_step(run_dir, at_step)
        restarts, fault_at = len(restart_lines()), time.monotonic()
        action()
        deadline = time.monotonic() + 180
        try:
            while len(restart_lines()) == restarts:  # the restarted run has resumed (it counts itself)
                assert time.monotonic() < deadline, f"no restart after {fault}"
                time.sleep(0.2)
            recovered[fault] = round(wait_for_step(run_dir, saved_step(run_dir) + 1, timeout=180) - fault_at, 1)
        except AssertionError as stalled:  # what the job printed and where SLURM has it: the cause, next time
            shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
            text = job_output(tmp_path / f"slurm-{job}.out")
            raise AssertionError(f"{stalled}\n{shown}\n{text[-6000:]}") from None

    def restart_lines() -> list[str]:
        path = run_dir / "lightning_logs" / "version_0" / "restarts.txt"
        return path.read_text().splitlines() if path.exists() else []

    job = submit(tmp_path, run_dir, "--requeue", fit=fit)
    hit("SIGKILL of rank 1", 40, lambda: os.kill(task_pid(job, 1), signal.SIGKILL))
    hit("SIGSTOP of rank 1", 100, lambda: os.kill(task_pid(job, 1), signal.SIGSTOP))

    def time_limit_signal() -> None:
        subprocess.run(["scancel", "--signal=USR1", job], check=True)
        release_when_requeued(job, restarts=1)

    def node_down_and_back() -> None:
        set_node("node2", "DOWN")
        try:
            deadline = time.monotonic() + 60
            while (job_state(job) or {}).get("restarts", 0) < 2:
                assert time.monotonic() < deadline, job_state(job)
                time.sleep(0.3)
        finally:
            set_node("node2", "RESUME")
        release_when_requeued(job, restarts=2)

    hit("time-limit signal", 160, time_limit_signal)
    hit("node2 down, then back", 240, node_down_and_back)
    state, text = finished(job, tmp_path)
    print(f"chaos job: {time.monotonic() - started:.1f} s; fault to the next checkpoint after recovery: {recovered}")
    assert (state["state"], state["exit_code"]) == ("COMPLETED", 0), f"{state}\n{text[-4000:]}"
    assert "[project] warm restart 1 of 3, in the same processes: rank 1 was killed by SIGKILL" in text
    assert "[project] warm restart 2 of 3, in the same processes: rank 1 stopped: its last heartbeat" in text
    restarts = (run_folder(run_dir) / "restarts.txt").read_text().splitlines()
    faults = [" restart 1 in its allocation: ", " restart 2 in its allocation: rank 1", " requeue 1: ", " requeue 2: "]
    expected = iter(faults)
    wanted, extra = next(expected), []
    for line in restarts:
        if wanted is not None and wanted in line:
            wanted = next(expected, None)
        else:
            extra.append(line)
    assert wanted is None, restarts  # every fault counted once, in order
    # A requeued job's first step can fail as the old run's tasks are cleaned up on the node it returns to (one SLURM
    # job id: the same port); srun's step is restarted in the allocation like any other failure, one line more.
    print(f"restarts beyond one per fault: {extra}")
    assert len(extra) <= 1 and all(" in its allocation: " in line for line in extra), restarts
    checkpoint = torch.load(last_checkpoint(run_dir), map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert_goodput_of_every_fault(read_records(run_folder(run_dir)), restarts)
    assert_same_weights(last_weights(run_dir), last_weights(reference[0]))
    assert [path.name for path in (run_dir / "lightning_logs").iterdir()] == ["version_0"]
    assert logged_metrics(run_dir) == logged_metrics(reference[0])


def assert_goodput_of_every_fault(records: list[dict], restarts: list[str]) -> None:
    """The chaos job's goodput record against what the test did: each restart that trained is a line of
    ``restarts.txt``; the two warm restarts' detection measured (SIGKILL: the peer's connection drops at once; SIGSTOP:
    the 10 s process-group timeout, from the stopped rank's last heartbeat), the requeues' not (SLURM's, unseen);
    each attempt resumed at or before the step the last one reached; the last finished the job's steps."""
    summary = summarize(records)
    said = [f"{record['restart']['what']}: {record['restart']['cause']}" for record in records if record["restart"]]
    assert set(said) <= set(restarts) and 4 <= len(summary.restarts) <= 5, (said, restarts)
    # (A requeued job's first step that failed, as the chaos test allows, adds a restart of its own after these two.)
    killed, stopped = [restart.detection_s for restart in summary.restarts if restart.detection_s is not None][:2]
    assert killed < 5 and 5 < stopped < 30, summary.restarts
    assert all(after["start_step"] <= before["end_step"] for before, after in zip(records, records[1:], strict=False))
    assert (records[-1]["outcome"], records[-1]["end_step"]) == ("finished", EPOCHS * STEPS_PER_EPOCH)
    assert 0 < summary.training_s < summary.wall_s
    print(f"chaos job: {one_line(summary)}")


ELASTIC_FIT = ("--data.class_path", "sample_accounting.IndexedDigits", *slow(0.05))
ELASTIC_FIT += ("--trainer.callbacks.first_attempt_only", "false", "--preemption.check_every_n_steps", "7")


def elastic_fit(samples: Path) -> tuple[str, ...]:
    return (
        *ELASTIC_FIT,
        "--trainer.callbacks+=sample_accounting.AttemptSamples",
        "--trainer.callbacks.output_dir",
        str(samples),
    )


def final_val_acc(run_dir: Path) -> float:
    return [float(row["val_acc"]) for row in metrics_rows(run_folder(run_dir)) if row.get("val_acc")][-1]


@pytest.fixture(scope="module")
def elastic_reference(slurm_cluster, tmp_path_factory):  # noqa: F811
    """The elastic job's data and callbacks on 2 nodes, uninterrupted: the accuracy the elastic job must reach."""
    out = tmp_path_factory.mktemp("elastic-reference")
    job = submit(out, out / "run", fit=elastic_fit(out / "samples"))
    state, text = finished(job, out)
    assert (state["state"], state["exit_code"]) == ("COMPLETED", 0), f"{state}\n{text[-4000:]}"
    return out


def test_a_job_requeued_onto_fewer_nodes_goes_on_there_and_takes_the_node_back_at_its_next_requeue(
    elastic_reference, tmp_path
):
    """A 2-node job loses node2 mid-run: SLURM requeues it, and the requeued job, made a 1-node job (`scontrol update
    JobId=N NumNodes=1 NumTasks=1 NumCPUs=1`, what an operator does when the node stays down), starts on node1 alone
    and resumes from the newest checkpoint on one rank: the rest of that epoch's samples, each once. With node2 back
    and the job given 2 nodes again, the time-limit signal requeues it and it resumes on both. It ends COMPLETED; every
    epoch trained each sample exactly once (the steps the lost attempt made after its checkpoint are dropped: they were
    trained again); accuracy within one validation sample (0.56 points) of the 2-node job's."""
    run_dir, samples = tmp_path / "run", tmp_path / "samples"
    # A periodic last.ckpt every second of training: the node is lost between two of them, inside an epoch.
    job = submit(tmp_path, run_dir, "--requeue", fit=elastic_fit(samples), CHECKPOINT_EVERY="0:00:01")
    wait_for_step(run_dir, 45)
    set_node("node2", "DOWN")  # the job is requeued
    set_node("node2", "DRAIN")  # and the node stays out
    try:
        deadline = time.monotonic() + 60
        while (job_state(job) or {}).get("restarts", 0) < 1:
            assert time.monotonic() < deadline, job_state(job)
            time.sleep(0.3)
        release_when_requeued(job, 1, 180, "NumNodes=1", "NumTasks=1", "NumCPUs=1")
        resumed = saved_step(run_dir)
        wait_for_step(run_dir, resumed + 20)  # a step saved by the one-node attempt
        assert (job_state(job) or {}).get("nodes") == "node1", job_state(job)
    finally:
        set_node("node2", "RESUME")
    subprocess.run(["scancel", "--signal=USR1", job], check=True)  # the time limit: saved, requeued
    release_when_requeued(job, 2, 180, "NumNodes=2", "NumTasks=2", "NumCPUs=2")
    state, text = finished(job, tmp_path)
    assert (state["state"], state["exit_code"]) == ("COMPLETED", 0), f"{state}\n{text[-4000:]}"
    kept, attempts = kept_samples(samples)
    assert [ranks for _, ranks in attempts] == [2, 1, 2], attempts
    assert sorted(kept) == list(range(EPOCHS))
    for epoch, trained in kept.items():
        assert sorted(trained) == list(range(TRAIN_SAMPLES)), f"epoch {epoch}: each sample once"
    # The goodput record: one line per attempt, each starting where the last stopped (both stops saved where they
    # stopped: SLURM's SIGTERM at the lost node, the time-limit signal), two restarts, nothing redone.
    records = read_records(run_folder(run_dir))
    assert [record["start_step"] for record in records] == [start for start, _ in attempts]
    assert [record["end_step"] for record in records[:-1]] == [start for start, _ in attempts[1:]]
    summary = summarize(records)
    assert (summary.attempts, len(summary.restarts), summary.steps_redone) == (3, 2, 0)
    assert 0 < summary.training_s < summary.wall_s
    print(f"elastic job: {one_line(summary)}")
    shown = run_project("report", str(run_folder(run_dir)), cwd=REPO)  # the report of a SLURM job's run
    assert shown.returncode == 0 and (run_folder(run_dir) / "goodput.png").stat().st_size > 0, shown.stderr
    ours, reference = final_val_acc(run_dir), final_val_acc(elastic_reference / "run")
    print(f"elastic job: attempts (start step, ranks) {attempts}; val_acc {ours:.4f} against {reference:.4f}")
    assert abs(ours - reference) <= 1 / 180 + 1e-6  # one of the 180 validation samples: half a point is finer
