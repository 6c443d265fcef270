"""Real runs of `python -m project`: forked from a warm server, fresh, or in this process, and what they leave
running."""

import contextlib
import io
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch.distributed as dist
from warm_start import WarmRun, WarmServer

from helpers.repository import DIGITS_CONFIG

# Variables Lightning or a launcher leaves behind; a leftover LOCAL_RANK fakes an external launcher.
LAUNCHER_VARS = ("LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def project_env(**extra: str) -> dict[str, str]:
    """The environment for a child run: no launcher leftovers, no SLURM, one thread per rank."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_PORT=str(free_port()))
    # The suite runs 3 ranks on 2-core machines on purpose (uneven shards): the variable silences the note
    # trainfleet/checks.py prints for them (tests count stderr lines), and starts them on any machine.
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


def close_warm_server() -> None:
    """Ends the warm server, if a run started it (at the end of the session: tests/conftest.py)."""
    if _server is not None:
        _server.close()


def run_in_process(*args: str) -> str:
    """`python -m project ARGS` in this process, what it printed (one rank only: Lightning would launch others by
    rerunning pytest). Saves a run's start-up (imports, about 8 s): for single-process runs."""
    from trainfleet.main import main

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
