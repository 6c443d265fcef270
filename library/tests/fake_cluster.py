"""Environments for launching like a cluster on one machine: the launcher scripts, and a faked SLURM allocation."""

import os
import sys
from pathlib import Path

from helpers import LIBRARY, REPO, project_env

SCRIPTS = REPO / "scripts"
# tests/bin/srun: starts the tasks of a faked allocation here, with the variables srun gives each task. Real jobs run on
# the local cluster (tests/test_slurm.py); the fake stays for what its 1-CPU nodes cannot hold (2 tasks a node).
FAKE_SRUN_DIR = LIBRARY / "tests" / "bin"


def launcher_env(**extra: str) -> dict[str, str]:
    """project_env with this interpreter's folder first on PATH: the scripts call `python` and `torchrun`."""
    env = project_env(**extra)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
    return env


def slurm_allocation(nodes: int, tasks_per_node: int, **extra: str) -> dict[str, str]:
    """What sbatch gives the batch script of `--nodes NODES --ntasks-per-node TASKS_PER_NODE`, plus the fake srun.

    MASTER_PORT stays the free port project_env picked: on a real cluster Lightning derives it from the job id.
    """
    env = launcher_env(
        SLURM_JOB_ID="4242",
        SLURM_JOB_NAME="project",
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NUM_NODES=str(nodes),
        SLURM_NTASKS=str(nodes * tasks_per_node),
        SLURM_NTASKS_PER_NODE=str(tasks_per_node),
        SLURM_NODELIST="localhost",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODEID="0",
        **extra,
    )
    env["PATH"] = os.pathsep.join([str(FAKE_SRUN_DIR), env["PATH"]])
    return env
