"""What the tests share: the repository's paths, real runs of the project, and what a run leaves behind. Import from
here (``from helpers import run_project``); tests/conftest.py holds only pytest's hooks and fixtures."""

from helpers.processes import (
    LAUNCHER_VARS,
    ProjectRun,
    exec_project,
    finish,
    free_port,
    processes_left,
    project_env,
    quick_args,
    run_in_process,
    run_project,
    start_python,
)
from helpers.repository import DIGITS_CONFIG, LIBRARY, REPO
from helpers.runs import (
    NOT_METRICS,
    checkpoint_dir,
    last_checkpoint,
    last_weights,
    logged_metrics,
    metric_values,
    metrics_rows,
    run_folder,
    saved_step,
)
from helpers.schedules import rates
from trainfleet.testing import assert_same_weights, differing_weights

__all__ = [
    "DIGITS_CONFIG",
    "LAUNCHER_VARS",
    "LIBRARY",
    "NOT_METRICS",
    "REPO",
    "ProjectRun",
    "assert_same_weights",
    "checkpoint_dir",
    "differing_weights",
    "exec_project",
    "finish",
    "free_port",
    "last_checkpoint",
    "last_weights",
    "logged_metrics",
    "metric_values",
    "metrics_rows",
    "processes_left",
    "project_env",
    "quick_args",
    "rates",
    "run_folder",
    "run_in_process",
    "run_project",
    "saved_step",
    "start_python",
]
