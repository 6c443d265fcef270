"""scripts/slurm.sbatch's restart loop, decision by decision, with stand-ins for srun and scontrol (the real cluster
runs it in tests/test_slurm.py): which step endings it restarts, its budget, and a job SLURM requeued meanwhile."""

import subprocess
from pathlib import Path

import pytest
from helpers import REPO, project_env

pytestmark = pytest.mark.slow  # every test here runs scripts/slurm.sbatch (bash, a fake srun)

SBATCH_SCRIPT = REPO / "scripts" / "slurm.sbatch"
# srun's stand-in: step N (0, 1, ...) exits with the Nth of STEP_CODES and records the Nth of STEP_WARM warm restarts
# (its supervisors' lines), then the Nth of STEP_OUTCOMES (a rank's "CODE<TAB>CAUSE" line, "-" for none) in
# PROJECT_EXIT_FILE; each step's PROJECT_RESTART_COUNT goes to steps.txt, its PROJECT_WARM_RESTARTS to warm.txt.
FAKE_SRUN = """#!/usr/bin/env bash
step=$(wc -l < "$FAKE_DIR/steps.txt" 2>/dev/null || echo 0)
echo "$PROJECT_RESTART_COUNT" >> "$FAKE_DIR/steps.txt"
echo "$PROJECT_WARM_RESTARTS" >> "$FAKE_DIR/warm.txt"
codes=($STEP_CODES) outcomes=($STEP_OUTCOMES) warm=($STEP_WARM)
for ((i = 0; i < ${warm[$step]:-0}; i++)); do printf 'restart\twarm %s\n' "$i" >> "$PROJECT_EXIT_FILE"; done
outcome=${outcomes[$step]:--}
[[ $outcome != - ]] && printf '%s\\tcause %s\\n' "$outcome" "$step" >> "$PROJECT_EXIT_FILE"
exit "${codes[$step]:-0}"
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo "JobId=$SLURM_JOB_ID JobState=RUNNING Restarts=$JOB_RESTARTS BatchFlag=1"
"""


def run_loop(tmp_path: Path, codes: str, outcomes: str = "", **env: str) -> tuple[subprocess.CompletedProcess, list]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    variables = project_env(
        PATH=f"{bin_dir}:/usr/bin:/bin", FAKE_DIR=str(tmp_path), STEP_CODES=codes, STEP_OUTCOMES=outcomes,
        SLURM_JOB_ID="7", SLURM_NNODES="2", SLURM_NTASKS_PER_NODE="1", PROJECT_EXIT_DIR=str(tmp_path),
        **{"JOB_RESTARTS": "0", **env},
    )  # fmt: skip
    done = subprocess.run(["bash", str(SBATCH_SCRIPT), "--config", "x.yaml"], env=variables, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    steps = (tmp_path / "steps.txt").read_text().split() if (tmp_path / "steps.txt").exists() else []
    return done, steps


def test_a_failed_step_is_restarted_in_the_allocation_with_its_cause_and_count(tmp_path):
    done, steps = run_loop(tmp_path, "1 143 0", "1 -")
    assert done.returncode == 0, done.stderr
    assert steps == ["0", "1", "2"]  # PROJECT_RESTART_COUNT of each step
    assert "[slurm.sbatch] restart 1 of 3 in this allocation: cause 0" in done.stderr  # what the rank recorded
    assert "restart 2 of 3 in this allocation: srun step ended with exit code 143: a rank was killed" in done.stderr
    assert not list(tmp_path.glob(".rank-exits-*"))  # removed at the end


@pytest.mark.parametrize("final", ["2", "3", "143"], ids=["refused", "nan-guard", "preempted"])
def test_a_step_a_rank_ended_for_good_ends_the_job_with_that_code(tmp_path, final):
    done, steps = run_loop(tmp_path, "143", final)  # srun: 143, a task ended by its SIGTERM
    assert done.returncode == int(final), done.stderr
    assert steps == ["0"] and "restart" not in done.stderr


def test_a_spent_budget_stops_the_job_saying_how_to_resume_by_hand(tmp_path):
    done, steps = run_loop(tmp_path, "1 1 1", MAX_RESTARTS="1")
    assert done.returncode == 1 and steps == ["0", "1"]
    assert "the restart budget is spent (MAX_RESTARTS=1 restarts in this allocation)" in done.stderr
    assert "Resume by hand: sbatch scripts/slurm.sbatch --config x.yaml --ckpt_path last" in done.stderr


def test_warm_restarts_count_against_the_budget_and_the_cause_is_the_last_failures(tmp_path):
    done, steps = run_loop(tmp_path, "1 1", "1 -", STEP_WARM="2")  # 2 warm restarts, then a failure in the step
    assert done.returncode == 1 and steps == ["0", "3"]
    assert (tmp_path / "warm.txt").read_text().split() == ["3", "0"]  # the budget left to each step's supervisors
    assert "[slurm.sbatch] restart 3 of 3 in this allocation: cause 0" in done.stderr
    assert "the restart budget is spent (MAX_RESTARTS=3 restarts in this allocation)" in done.stderr


def test_a_job_slurm_requeued_meanwhile_is_not_restarted_by_its_old_script(tmp_path):
    done, steps = run_loop(tmp_path, "143 0", JOB_RESTARTS="1")  # a lost node: SLURM requeued the job
    assert done.returncode == 143 and steps == ["0"]
    assert "job 7 was requeued or ended by SLURM" in done.stderr
