"""Shared fixtures: a clean environment per test and a runner for real `python -m project` processes."""

import contextlib
import csv
import io
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from warm_start import WarmRun, WarmServer

from project.runtime.known_noise import silence_known_noise

silence_known_noise()  # as every command does (project/__main__.py)

# In-process runs share the 2 cores with the other worker's runs: OpenMP threads that wait for a busy core cost
# far more than they gain (a CNN test took 8x as long with 2 threads under load).
torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[1]
DIGITS_CONFIG = REPO / "configs" / "digits.yaml"
# Variables Lightning or a launcher leaves behind; a leftover LOCAL_RANK fakes an external launcher.
LAUNCHER_VARS = ("LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED")


SLOW_RULE = "mark it slow (@pytest.mark.slow, or pytestmark = pytest.mark.slow for a file): docs/development.md"


@contextlib.contextmanager
def no_child_processes(test: str):
    """Refuses, in a test not marked slow, what starts a process (a fork, a multiprocessing worker, a warm or fresh
    interpreter, a launcher or script): the fast subset (`-m "not slow"`) stays fast because no test in it can start
    one. Allowed: `git` queries, and a `python -c` query, as jsonargparse's stub resolver (typeshed_client) asks the
    interpreter its sys.path once."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{test} starts a process: {SLOW_RULE}")

    popen_init = subprocess.Popen.__init__

    def popen_if_quick(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        argv = str(args).split() if isinstance(args, str | os.PathLike) else [str(arg) for arg in args]
        program = Path(argv[0]).name
        if program != "git" and not (program.startswith("python") and argv[1:2] == ["-c"]):
            refuse()
        popen_init(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", popen_if_quick)
        patch.setattr(os, "fork", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        patch.setattr(WarmServer, "start", refuse)
        yield


def process_guard(item: pytest.Item) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if item.get_closest_marker("slow") else no_child_processes(item.nodeid)


# The longest files first (their share of the suite in its last runs): xdist hands whole files to its 2 workers
# (--dist loadfile) in collection order, and a long file started late is the suite's tail on one worker.
LONGEST_FIRST = ("test_slurm.py", "test_template.py", "test_faults.py", "test_fsdp.py", "test_resume.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: files stay whole


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # module-scoped fixtures run here: a shared run counts too
    with process_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with process_guard(item):
        return (yield)


@pytest.fixture(autouse=True)
def restore_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def project_env(**extra: str) -> dict[str, str]:
    """The environment for a child run: no launcher leftovers, no SLURM, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_PORT=str(free_port()))
    # The suite runs 3 ranks on 2-core machines on purpose (uneven shards): project/checks.py would refuse them.
    env.update(PROJECT_OVERSUBSCRIBE="1")
    env.update(extra)
    return env


class ProjectRun(subprocess.CompletedProcess):
    """A finished run; ``session``: the session its processes belong to (see ``processes_left``)."""

    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str, session: int) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.session = session


_server: WarmServer | None = None


def start_python(*argv: str, cwd: Path, env: dict | None = None) -> WarmRun:
    """Starts `python ARGV` (``-m MODULE ...`` or ``-c CODE ...``) as a process forked from a server that has imported
    the project (tests/warm_start.py): a run without the start-up (about 8 s). ``finish`` waits for it."""
    global _server
    if _server is None:
        _server = WarmServer(project_env())
    return _server.start(list(argv), Path(cwd), env or project_env(), Path(tempfile.mkdtemp(prefix="run-output-")))


def finish(run: WarmRun, timeout: float = 300) -> ProjectRun:
    """Waits for RUN and every process it started, and returns it with what it printed."""
    returncode = run.wait(timeout)
    stdout, stderr = run.stdout.read_text(), run.stderr.read_text()
    shutil.rmtree(run.stdout.parent)
    return ProjectRun(["python", *run.argv], returncode, stdout, stderr, run.pid)


def run_project(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> ProjectRun:
    """Runs `python -m project ARGS` to its end, every rank included, with stdout and stderr captured (forked from
    the warm server: see ``start_python``)."""
    return finish(start_python("-m", "project", *args, cwd=cwd, env=env), timeout)


def exec_project(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> ProjectRun:
    """Runs a fresh `python -m project ARGS`, start-up included, like ``run_project``."""
    with subprocess.Popen(
        [sys.executable, "-m", "project", *args],
        cwd=cwd,
        env=env or project_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
        return ProjectRun(list(args), process.returncode, stdout, stderr, process.pid)


def processes_left(run: ProjectRun) -> list[int]:
    """Live processes of RUN's session: its ranks or their workers, if any outlived it (an exited process whose
    parent died before it waits, a zombie, to be reaped by init: not counted)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        except OSError:  # the process ended while we looked
            continue
        if int(fields[3]) == run.session and fields[0] != "Z":  # the session, stat's 6th field; the state, its 3rd
            pids.append(int(stat.parent.name))
    return pids


@pytest.fixture(scope="session", autouse=True)
def close_warm_server():
    yield
    if _server is not None:
        _server.close()


def run_in_process(*args: str) -> str:
    """`python -m project ARGS` in this process, what it printed (one rank only: Lightning would launch others by
    rerunning pytest). Saves a run's start-up (imports, about 8 s): for single-process runs."""
    from project.__main__ import main

    output, saved_env, saved_argv = io.StringIO(), dict(os.environ), sys.argv
    sys.argv = ["project"]  # LightningCLI warns when sys.argv (pytest's) and args are both given
    # Lightning's messages go through its loggers, whose handlers hold the stream of whichever test imported it.
    handler, lightning_logger = logging.StreamHandler(output), logging.getLogger("lightning.pytorch")
    lightning_logger.addHandler(handler)
    try:
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            main(list(args))
    finally:
        if dist.is_initialized():  # what the process's exit would end: the next run starts its own
            dist.destroy_process_group()
        lightning_logger.removeHandler(handler)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update({k: v for k, v in saved_env.items() if k not in LAUNCHER_VARS})
    return output.getvalue()


def run_folder(root: Path, version: int | None = None) -> Path:
    """The folder of one run under ROOT (``trainer.default_root_dir``), the newest when VERSION is None:
    ``lightning_logs/version_N`` with the run's ``checkpoints/``, ``config.yaml`` and ``metrics.csv``."""
    if version is not None:
        return root / "lightning_logs" / f"version_{version}"
    versions = sorted(root.glob("lightning_logs/version_*"), key=lambda path: int(path.name.split("_")[1]))
    assert versions, f"no run in {root}"
    return versions[-1]


def metrics_rows(folder: Path) -> list[dict[str, str]]:
    """The rows of the metrics.csv in run FOLDER (``run_folder``), as ``csv.DictReader`` reads them ("" when unset)."""
    with (folder / "metrics.csv").open(newline="") as file:
        return list(csv.DictReader(file))


def metric_values(folder: Path, name: str) -> list[float]:
    """NAME's values in the metrics.csv of run FOLDER, in logged order (the rows that hold it)."""
    return [float(row[name]) for row in metrics_rows(folder) if row.get(name)]


def logged_metrics(root: Path) -> list[tuple[str, int]]:
    """Each (metric, step) that the newest run under ROOT logged in its metrics.csv, in file order: a run resumed
    after an interruption holds each step once, as the uninterrupted run does."""
    rows = metrics_rows(run_folder(root))
    return [(key, int(row["step"])) for row in rows for key, value in row.items() if value and key not in NOT_METRICS]


NOT_METRICS = ("step", "epoch")


def checkpoint_dir(root: Path, version: int | None = None) -> Path:
    """Where a run's checkpoints are: the newest run that has any, when VERSION is None."""
    if version is not None:
        return run_folder(root, version) / "checkpoints"
    [*_, newest] = sorted(root.glob("lightning_logs/version_*/checkpoints"), key=lambda p: int(p.parent.name[8:]))
    return newest


def last_checkpoint(root: Path, version: int | None = None) -> Path:
    return checkpoint_dir(root, version) / "last.ckpt"


def last_weights(root: Path) -> dict[str, torch.Tensor]:
    """The state dict of the newest run's ``last.ckpt`` under ROOT."""
    return torch.load(last_checkpoint(root), map_location="cpu", weights_only=True)["state_dict"]


def differing_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> list[str]:
    """The names one state dict lacks, then those whose tensors are not bit-identical."""
    missing = sorted(actual.keys() ^ expected.keys())
    return missing + [name for name in expected if name in actual and not torch.equal(actual[name], expected[name])]


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """Bit-identical state dicts: the same names, every tensor equal (the assertion names those that differ)."""
    assert differing_weights(actual, expected) == []


def quick_args(run_dir: Path, *extra: str) -> list[str]:
    """Flags for a fast digits run into RUN_DIR: no progress bar, no sanity check. RUN_DIR comes last: an overlay in
    EXTRA names its own folder (configs/image_folder.yaml)."""
    return [
        "--config",
        str(DIGITS_CONFIG),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.num_sanity_val_steps",
        "0",
        *extra,
        "--trainer.default_root_dir",
        str(run_dir),
    ]
