"""Shared fixtures: a clean environment per test and a runner for real `python -m project` processes."""

import contextlib
import io
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
DIGITS_CONFIG = REPO / "configs" / "digits.yaml"
# Variables Lightning or a launcher leaves behind; a leftover LOCAL_RANK fakes an external launcher.
LAUNCHER_VARS = ("LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED")


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
    env.update(extra)
    return env


def run_project(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `python -m project ARGS` to completion and returns it (stdout and stderr captured)."""
    return subprocess.run(
        [sys.executable, "-m", "project", *args],
        cwd=cwd,
        env=env or project_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_in_process(*args: str) -> str:
    """`python -m project ARGS` in this process, what it printed (one rank only: Lightning would launch others by
    rerunning pytest). Saves a run's start-up (imports, about 8 s): for single-process runs."""
    from project.cli import main

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


def checkpoint_dir(root: Path, version: int | None = None) -> Path:
    """Where a run's checkpoints are: the newest run that has any, when VERSION is None."""
    if version is not None:
        return run_folder(root, version) / "checkpoints"
    [*_, newest] = sorted(root.glob("lightning_logs/version_*/checkpoints"), key=lambda p: int(p.parent.name[8:]))
    return newest


def last_checkpoint(root: Path, version: int | None = None) -> Path:
    return checkpoint_dir(root, version) / "last.ckpt"


def quick_args(run_dir: Path, *extra: str) -> list[str]:
    """Flags for a fast digits run into RUN_DIR: no progress bar, no sanity check."""
    return [
        "--config",
        str(DIGITS_CONFIG),
        "--trainer.default_root_dir",
        str(run_dir),
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.num_sanity_val_steps",
        "0",
        *extra,
    ]
