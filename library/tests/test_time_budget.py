"""A time budget is a length (trainfleet/time_budget.py): a ``max_time`` run's schedule is fitted to the steps its
measured pace allows, the smaller bound winning, and the estimate travels in the schedule's state."""

import pytest
import torch
from helpers import rates
from project.schedules import WarmupCosineLR
from torch import nn

from trainfleet.time_budget import LengthEstimate, PaceMeter


def test_the_length_is_the_steps_taken_plus_the_pace_times_the_time_left():
    estimate = LengthEstimate(max_time=20.0, measured_steps=50, measured_seconds=0.5, at_step=51, seconds_left=19.0)
    assert estimate.pace == pytest.approx(100.0)
    assert estimate.total_steps() == 51 + 1900
    assert estimate.line("WarmupCosineLR") == (
        "schedule: max_time 0:00:20 bounds the run: WarmupCosineLR fitted to 1951 steps, estimated from the pace of"
        " steps 1-51 (100.0 steps/s)"
    )


def test_the_smaller_bound_wins_and_a_budget_ending_in_the_warm_up_keeps_one_cosine_step():
    by_time = dict(max_time=20.0, measured_steps=50, measured_seconds=0.5, at_step=51, seconds_left=19.0)
    assert LengthEstimate(**by_time, bound=400).total_steps() == 400  # max_steps/max_epochs stop it first
    assert "max_steps/max_epochs end the run before max_time 0:00:20 would (1951 steps at 100.0" in LengthEstimate(
        **by_time, bound=400
    ).line("WarmupCosineLR")
    assert LengthEstimate(**by_time, bound=5000).total_steps() == 1951  # the time runs out first
    assert LengthEstimate(**{**by_time, "seconds_left": 0.0}).total_steps(warmup_steps=100) == 101


class FakeTimer:
    """Lightning's Timer as PaceMeter reads it: a clock the test moves."""

    def __init__(self, duration: float) -> None:
        self.duration, self.now = duration, 0.0

    def time_elapsed(self) -> float:
        return self.now

    def time_remaining(self) -> float:
        return self.duration - self.now


def test_the_pace_is_timed_after_the_start_up_steps():
    timer = FakeTimer(10.0)
    meter = PaceMeter(timer, bound=None, first_step=30, steps=4)  # type: ignore[arg-type]  # resumed at step 30
    timer.now = 3.0  # steps 31-33 pay the start-up (a first validation, a first checkpoint): not timed
    assert [meter.estimate(global_step=step) for step in (31, 32, 33)] == [None, None, None]
    assert meter.estimate(global_step=34) is None  # the window opens
    timer.now = 3.3
    assert meter.estimate(global_step=37) is None
    timer.now = 3.4
    estimate = meter.estimate(global_step=38)
    assert estimate is not None and (estimate.measured_steps, estimate.at_step) == (4, 38)
    assert estimate.pace == pytest.approx(10.0) and estimate.total_steps() == 38 + 66  # 6.6 s left at 10 steps/s


def schedule(warmup_steps: int = 0) -> WarmupCosineLR:
    return WarmupCosineLR(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0), warmup_steps=warmup_steps)


def test_a_provisional_schedule_holds_the_cosines_start_until_fitted_then_resumes_on_the_fitted_curve():
    first = schedule(warmup_steps=2)
    first.hold(bound=None)
    assert rates(first, 5) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0])  # warm-up, then base_lr held
    first.fit_to(13, {"measured_steps": 4})
    state = first.state_dict()
    assert (state["total_steps"], state["provisional"], state["estimate"]) == (13, False, {"measured_steps": 4})
    resumed = schedule(warmup_steps=2)
    resumed.hold(bound=None)  # what a resumed run builds, before Lightning loads the checkpoint's state
    resumed.load_state_dict(state)
    assert rates(resumed, 10) == rates(first, 10)
    assert first.get_last_lr() == [0.0]  # past step 13: eta_min


def test_a_provisional_schedule_with_a_step_bound_follows_it_until_fitted():
    bounded, plain = schedule(), schedule()
    bounded.hold(bound=10)
    plain.fit_to(10)
    assert rates(bounded, 4) == rates(plain, 4)
    assert bounded.provisional and bounded.estimate is None
