"""A real SLURM cluster for the tests marked ``slurm``: tests/fixtures/slurm_cluster.sh's two nodes on this machine.

``slurm_cluster`` (session fixture) uses the cluster when it is up (CI's `.ci/run` starts it before pytest), starts it
otherwise (root only: it may apt-get slurm-wlm and munge) and skips with the reason when it cannot be had. A cluster
the tests started is stopped by the last session that used it. ``sbatch`` submits, ``wait_job`` waits for the end
and returns the scheduler's state and exit code, ``job_output`` reads a job's ``--output`` file.
"""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import LAUNCHER_VARS, LIBRARY, REPO

CLUSTER_SCRIPT = LIBRARY / "tests" / "fixtures" / "slurm_cluster.sh"
CLUSTER_DIR = Path(os.environ.get("SLURM_CLUSTER_DIR", "/tmp/project-slurm"))
NODES = ("node1", "node2")
# A job in any other state is over (requeued jobs go back to PENDING; COMPLETING: its processes are being ended).
ACTIVE_STATES = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
    "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED", "RESV_DEL_HOLD",
}  # fmt: skip


@dataclass(frozen=True)
class SlurmCluster:
    directory: Path  # SLURM_CLUSTER_DIR: slurm.conf, state, logs (log/slurmctld.log, log/slurmd-nodeN.log)
    nodes: tuple[str, ...] = NODES
    partition: str = "debug"


def _run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def cluster_is_up() -> bool:
    """Both nodes answer in the ``debug`` partition (idle or running jobs)."""
    if shutil.which("sinfo") is None:
        return False
    try:
        result = _run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t", timeout=10)
    except subprocess.TimeoutExpired:
        return False
    states = dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)
    return result.returncode == 0 and all(
        states.get(node, "").rstrip("*") in {"idle", "alloc", "mix"} for node in NODES
    )


def _cannot_start() -> str | None:
    if os.geteuid() != 0:
        return "not root: tests/fixtures/slurm_cluster.sh up (apt-get, munged, slurmctld, slurmd) needs root"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return "no slurmctld and no apt-get to install slurm-wlm"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    """The cluster, up for the whole session; skips the test with the reason when it cannot be had."""
    CLUSTER_DIR.parent.mkdir(parents=True, exist_ok=True)
    # A shared lock per session using the cluster (pytest-xdist runs one session per worker); starting it and
    # stopping it take the lock exclusively, so the last user of a cluster the tests started stops it.
    lock = open(CLUSTER_DIR.parent / f".{CLUSTER_DIR.name}.lock", "a+")  # noqa: SIM115 (held for the session)
    started_marker = CLUSTER_DIR / "run" / "started-by-tests"
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cluster_is_up():
            reason = _cannot_start()
            if reason:
                pytest.skip(f"no SLURM cluster: {reason}")
            try:
                result = _run("bash", str(CLUSTER_SCRIPT), "up", timeout=900)
            except subprocess.TimeoutExpired:
                pytest.skip("no SLURM cluster: tests/fixtures/slurm_cluster.sh up took over 900 s")
            if result.returncode != 0 or not cluster_is_up():
                pytest.skip(
                    f"no SLURM cluster: tests/fixtures/slurm_cluster.sh up exited {result.returncode} "
                    f"(slurmctld or slurmd would not start):\n{(result.stdout + result.stderr)[-2000:]}"
                )
            started_marker.touch()
        fcntl.flock(lock, fcntl.LOCK_SH)  # from exclusive to shared: other sessions may use it now
        yield SlurmCluster(CLUSTER_DIR)
        fcntl.flock(lock, fcntl.LOCK_UN)
        with contextlib.suppress(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # no other session holds it: we are the last
            if started_marker.exists():
                _run("bash", str(CLUSTER_SCRIPT), "down", timeout=120)
                started_marker.unlink(missing_ok=True)
    finally:
        lock.close()


def slurm_env(**extra: str) -> dict[str, str]:
    """The environment to submit with (sbatch exports it to every task): this interpreter's folder first on PATH (the
    sbatch script calls `python`), one thread per task, no launcher leftovers and no variables of an enclosing
    allocation (SLURM_CONF excepted). MASTER_PORT is not set: Lightning's SLURMEnvironment derives it from the job
    id, as on a real cluster."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and (not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")) or k == "SLURM_CONF")
    }
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "/usr/bin:/bin")])
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def sbatch(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> str:
    """`sbatch --parsable ARGS` (options, the script, then its arguments); returns the job id."""
    result = subprocess.run(
        ["sbatch", "--parsable", *args], cwd=cwd, env=env or slurm_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"sbatch {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout.strip().split(";")[0]  # "ID" or "ID;cluster"


def _parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o ID`'s Key=Value pairs (values without spaces but Command/WorkDir/StdOut may hold
    '=' signs: each pair is split at its first '=')."""
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def job_info(job_id: str) -> dict[str, str] | None:
    """The job as the controller holds it (for MinJobAge, 60 s, after its end), None once it is purged."""
    result = _run("scontrol", "show", "job", "-o", str(job_id))
    if result.returncode != 0 or not result.stdout.strip():
        return None
    return _parse_scontrol(result.stdout.splitlines()[0])


def _exit_code(value: str) -> tuple[int, int]:
    code, _, signal = value.partition(":")
    return int(code or 0), int(signal or 0)


def _from_jobcomp(job_id: str) -> dict | None:
    """A finished job from the job completion log (sacct --completion: no slurmdbd here)."""
    result = _run("sacct", "--completion", "-n", "-P", "-j", str(job_id), "-o", "JobID,State,ExitCode,NodeList")
    rows = [line.split("|") for line in result.stdout.splitlines() if line.split("|")[0] == str(job_id)]
    if result.returncode != 0 or not rows:
        return None
    _, state, exit_code, nodes = rows[-1]  # a requeued job has one row per run: the last is the final one
    code, signal = _exit_code(exit_code)
    return {"job_id": str(job_id), "state": state.split()[0], "exit_code": code, "signal": signal, "nodes": nodes}


def job_state(job_id: str) -> dict | None:
    """``{"job_id", "state", "exit_code", "signal", "nodes", "restarts", "reason", "stdout"}`` (the last three only
    while the controller holds the job); None when the job is unknown."""
    info = job_info(job_id)
    if info is None:
        return _from_jobcomp(job_id)
    code, signal = _exit_code(info.get("ExitCode", "0:0"))
    return {
        "job_id": str(job_id),
        "state": info.get("JobState", "UNKNOWN"),
        "exit_code": code,
        "signal": signal,
        "nodes": info.get("NodeList", ""),
        "restarts": int(info.get("Restarts", "0")),
        "reason": info.get("Reason", ""),
        "stdout": info.get("StdOut", ""),
    }


def wait_job(job_id: str, timeout: float = 300, poll: float = 1.0) -> dict:
    """Waits until the job is over (a requeued job runs again first) and returns ``job_state``: its final state
    (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) and exit code. On timeout the job is cancelled and the test fails."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state is not None and state["state"] not in ACTIVE_STATES:
            return state
        time.sleep(poll)
    _run("scancel", str(job_id))
    pytest.fail(f"SLURM job {job_id} not finished after {timeout:.0f} s (cancelled): {state}")


def wait_state(job_id: str, states: set[str] | str = "RUNNING", timeout: float = 120, poll: float = 0.5) -> dict:
    """Waits until the job is in one of STATES (e.g. RUNNING before signalling it); fails the test otherwise."""
    states = {states} if isinstance(states, str) else states
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state is not None and state["state"] in states:
            return state
        time.sleep(poll)
    pytest.fail(f"SLURM job {job_id} not in {sorted(states)} after {timeout:.0f} s: {state}")


def job_processes(job_id: str) -> list[int]:
    """The processes of JOB_ID on this machine (every node of the test cluster is here): its steps' ``slurmstepd``,
    and the batch script, srun and tasks they started (SLURM_JOB_ID in their environment), which can outlive their
    step after a node failure."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            text = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # the process ended while we looked
            continue
        if text.startswith(f"slurmstepd: [{job_id}.") or f"SLURM_JOB_ID={job_id}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def release_when_requeued(job_id: str, restarts: int = 1, timeout: float = 180, *updates: str) -> float:
    """Once the requeued job waits (PENDING, reason BeginTime: about 2 minutes) and its previous run's steps are gone
    from every node, lets it start now; returns the seconds from the call to the release.

    Released while the nodes still clean up the previous run, the job was killed as "non-startable: Job credential
    revoked" and ended FAILED: the steps' processes must be gone first, then the controller must
    show no step of the job. Those held 60 ms after a requeue and the job was still killed so (a CI run): the nodes must
    also be done completing, and all of it must hold for 2 s. UPDATES (``TimeLimit=5``, ...) are made in the same
    ``scontrol update``."""
    start, deadline, ready_since = time.monotonic(), time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        state = job_state(job_id)
        ready = (
            state
            and state["state"] == "PENDING"
            and state.get("restarts", 0) >= restarts
            and not job_processes(job_id)
            and not _run("squeue", "-h", "-s", "-j", str(job_id)).stdout.strip()
            and "completing" not in _run("sinfo", "-h", "-o", "%T").stdout.lower()
        )
        ready_since = (ready_since or time.monotonic()) if ready else None
        if ready_since is not None and time.monotonic() - ready_since >= 2:
            _run("scontrol", "update", f"JobId={job_id}", "StartTime=now", *updates)
            return time.monotonic() - start
        time.sleep(0.3)
    pytest.fail(f"job {job_id} was not requeued within {timeout:.0f} s: {job_state(job_id)}")


def job_output(path: Path | str, timeout: float = 10) -> str:
    """The text of a job's ``--output`` file (waiting up to TIMEOUT s for it to appear); "" if it never does."""
    path = Path(path)
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return path.read_text(errors="replace") if path.exists() else ""
