"""One way to set the optimizer and scheduler (the module's), and schedules that fit the run: warm-up, then cosine to
the run's last step, stepped per optimizer step."""

import math
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    DIGITS_CONFIG,
    LIBRARY,
    REPO,
    assert_same_weights,
    last_checkpoint,
    project_env,
    quick_args,
    rates,
    run_project,
)
from project.schedules import WarmupCosineLR
from torch import nn

from trainfleet.main import main


def test_warm_up_is_linear_then_cosine_reaches_eta_min_at_the_last_step():
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.4)
    used = rates(WarmupCosineLR(optimizer, warmup_steps=4, total_steps=12, eta_min=0.04), 14)
    assert used[:5] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4])  # base * (t + 1) / 4, then the cosine's start
    cosine = [0.04 + 0.36 * (1 + math.cos(math.pi * (t - 4) / 8)) / 2 for t in range(5, 14)]
    assert used[5:] == pytest.approx(cosine[:7] + [0.04, 0.04])  # at and past step 12: eta_min


def test_a_resumed_scheduler_continues_on_the_same_curve():
    def fresh() -> WarmupCosineLR:
        return WarmupCosineLR(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0), warmup_steps=3, total_steps=9)

    first = fresh()
    rates(first, 2)  # stopped mid-warm-up
    resumed = fresh()
    resumed.load_state_dict(first.state_dict())
    assert rates(resumed, 7) == rates(first, 7)


def test_warm_up_longer_than_the_run_is_refused():
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)
    with pytest.raises(ValueError, match="need 0 <= warmup_steps < total_steps; got 5 and 5"):
        WarmupCosineLR(optimizer, warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match=r"warmup_steps \(5\) must be below the run's 4 steps"):
        WarmupCosineLR(optimizer, warmup_steps=5).fit_to(4)


@pytest.mark.parametrize("flag", ["--optimizer", "--lr_scheduler"])
def test_lightning_cli_optimizer_flags_are_unknown_keys(monkeypatch, capsys, tmp_path, flag):
    """The optimizer is set in one place, model.optimizer: what config.yaml records is what trains."""
    monkeypatch.setattr(sys, "argv", ["project"])
    with pytest.raises(SystemExit) as exit_info:
        main(
            ["fit", "--config", str(DIGITS_CONFIG), "--trainer.default_root_dir", str(tmp_path / "run"), flag, "AdamW"]
        )
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"unknown key {flag[2:]}" in error and f"did you mean {flag[2:]}?" not in error
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_killed_mid_warm_up_resumes_to_the_same_weights(tmp_path):
    """One process, 2 epochs of 20 steps, 25 warm-up steps; the first run is killed at step 14 (a checkpoint every 4
    steps: it resumes at step 12, mid-epoch and mid-warm-up): the same weights as a run never stopped."""
    flags = ("--trainer.max_epochs", "2", "--model.scheduler.init_args.warmup_steps", "25")
    flags += ("--model.network.init_args.dropout", "0.3", "--checkpoint.every_n_train_steps", "4")
    env = project_env(PYTHONPATH=str(LIBRARY / "tests"))
    whole = run_project("fit", *quick_args(tmp_path / "whole", *flags), cwd=REPO)
    assert whole.returncode == 0, whole.stderr[-3000:]
    kill = ("--trainer.callbacks+=fault_injection.FailAt", "--trainer.callbacks.step", "14")
    killed = run_project(
        "fit",
        *quick_args(tmp_path / "resumed", *flags, *kill, "--trainer.callbacks.action", "sigkill"),
        cwd=REPO,
        env=env,
    )
    assert killed.returncode == -9
    assert torch.load(last_checkpoint(tmp_path / "resumed"))["lr_schedulers"][0]["last_epoch"] == 12
    resumed = run_project("fit", *quick_args(tmp_path / "resumed", *flags, "--ckpt_path", "last"), cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ends = [torch.load(last_checkpoint(tmp_path / name)) for name in ("whole", "resumed")]
    assert [end["global_step"] for end in ends] == [40, 40]
    assert [end["lr_schedulers"][0]["total_steps"] for end in ends] == [40, 40]
    assert_same_weights(ends[1]["state_dict"], ends[0]["state_dict"])


def step_checkpoints(root: Path) -> dict[int, Path]:
    """The run's ``epoch=E-step=S.ckpt`` files under ROOT, by step."""
    found = {}
    for path in root.rglob("epoch=*-step=*.ckpt"):
        found[int(re.search(r"step=(\d+)", path.name)[1])] = path
    return found


def rewind(run: Path, to: Path) -> None:
    """RUN's folder as a run killed right after the step checkpoint TO: the later ones gone, last.ckpt that one."""
    step = int(re.search(r"step=(\d+)", to.name)[1])
    for later, path in step_checkpoints(run).items():
        if later > step:
            path.unlink()
    shutil.copyfile(to, to.parent / "last.ckpt")


@pytest.mark.slow
def test_a_max_time_run_fits_its_schedule_to_its_pace_and_a_resumed_one_keeps_the_same_rates(tmp_path):
    """``max_time`` 8 s with ``max_epochs -1`` (refused with exit 2 before): the schedule is fitted once, at step 100
    from the pace of steps 50-100, and says so in one line; the estimate is in the checkpoints. The run rewound to a
    step checkpoint past the fit and resumed with ``--ckpt_path last`` keeps that length: at every later step it saved,
    the same learning rate and weights as the run never stopped."""
    flags = ("--trainer.max_epochs", "-1", "--trainer.max_time", "00:00:00:08", "--model.network.init_args.dropout")
    flags += ("0.3", "--checkpoint.every_n_train_steps", "10", "--checkpoint.save_top_k", "-1")
    whole = run_project("fit", *quick_args(tmp_path / "whole", *flags), cwd=REPO)
    assert whole.returncode == 0, whole.stderr[-3000:]
    line = re.search(
        r"\[project\] schedule: max_time 0:00:08 bounds the run: WarmupCosineLR fitted to (\d+) steps, estimated"
        r" from the pace of steps 50-100 \(([\d.]+) steps/s\)",
        whole.stderr,
    )
    assert line, whole.stderr[-3000:]
    end = torch.load(last_checkpoint(tmp_path / "whole"), weights_only=True)
    scheduler = end["lr_schedulers"][0]
    assert scheduler["total_steps"] == int(line[1]) and not scheduler["provisional"]
    assert scheduler["estimate"]["measured_steps"] == 50 and scheduler["estimate"]["at_step"] == 100
    print(f"estimated {scheduler['total_steps']} steps at {line[2]} steps/s; the run took {end['global_step']}")
    saved = step_checkpoints(tmp_path / "whole")
    start = 110  # past the fit at step 100, mid-epoch (20 steps an epoch: pitfall 28)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    rewind(tmp_path / "resumed", step_checkpoints(tmp_path / "resumed")[start])
    resumed = run_project("fit", *quick_args(tmp_path / "resumed", *flags, "--ckpt_path", "last"), cwd=REPO)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"WarmupCosineLR keeps the {scheduler['total_steps']} steps estimated before" in resumed.stderr
    assert "bounds the run" not in resumed.stderr
    again = step_checkpoints(tmp_path / "resumed")
    common = sorted(step for step in saved.keys() & again.keys() if step > start)
    assert len(common) >= 3, (start, sorted(saved), sorted(again))
    for step in common:
        ours, theirs = (torch.load(found[step], weights_only=True) for found in (again, saved))
        assert ours["lr_schedulers"][0]["_last_lr"] == theirs["lr_schedulers"][0]["_last_lr"], step
        assert_same_weights(ours["state_dict"], theirs["state_dict"])
