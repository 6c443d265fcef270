"""One way to set the optimizer and scheduler (the module's), and schedules that fit the run: warm-up, then cosine to
the run's last step, stepped per optimizer step."""

import math
import sys

import pytest
import torch
from helpers import DIGITS_CONFIG, REPO, assert_same_weights, last_checkpoint, project_env, quick_args, run_project
from torch import nn

from project.__main__ import main
from project.schedules import WarmupCosineLR


def rates(scheduler: WarmupCosineLR, steps: int) -> list[float]:
    """The learning rate each of STEPS optimizer steps uses."""
    used = []
    for _ in range(steps):
        used.append(scheduler.get_last_lr()[0])
        scheduler.optimizer.step()
        scheduler.step()
    return used


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
    env = project_env(PYTHONPATH=str(REPO / "tests"))
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
