"""A run bounded by ``trainer.max_time``: how many steps it will take, for the schedules fitted to the run's length.

``max_time`` is a length too, in seconds, and a schedule needs it in steps. The number of steps a budget allows is
known only once the run's pace is: the module times ``PACE_STEPS`` steps of the attempt on the Trainer's own clock
(its ``Timer``, the one that stops the run) after the first ``PACE_STEPS`` (which pay the start-up costs), and the
schedule is fitted once, to the steps taken plus the pace times the time left. The estimate is kept in the schedule's
state (checkpointed): a resumed run continues the same curve instead of estimating again. Where ``max_steps`` or
``max_epochs`` also bound the run, the smaller bound wins, as Lightning stops at whichever comes first.
"""

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Timer

PACE_STEPS = 50  # steps left untimed, then timed, before the schedule is fitted: on digits 2.5 epochs, their ends in


@dataclass(frozen=True)
class LengthEstimate:
    """The run's length in steps from its pace: ``measured_steps`` took ``measured_seconds``; at ``at_step``,
    ``seconds_left`` of ``max_time`` remained. ``bound``: the steps ``max_steps``/``max_epochs`` allow, if finite."""

    max_time: float
    measured_steps: int
    measured_seconds: float
    at_step: int
    seconds_left: float
    bound: int | None = None

    @property
    def pace(self) -> float:
        """Steps per second, the Timer's seconds: validation and checkpoints that fell in the window included."""
        return self.measured_steps / max(self.measured_seconds, 1e-9)

    @property
    def by_time(self) -> int:
        return self.at_step + int(self.pace * max(self.seconds_left, 0.0))

    def total_steps(self, warmup_steps: int = 0) -> int:
        """The smaller bound, and past the warm-up: a budget that ends inside it gets one step of cosine."""
        steps = self.by_time if self.bound is None else min(self.by_time, self.bound)
        return max(steps, warmup_steps + 1)

    def line(self, schedule: str, warmup_steps: int = 0) -> str:
        """The rule, in the one line the run states."""
        total, budget = self.total_steps(warmup_steps), timedelta(seconds=round(self.max_time))
        window = f"steps {self.at_step - self.measured_steps}-{self.at_step}"
        if self.bound is not None and self.bound < self.by_time:
            return (
                f"schedule: max_steps/max_epochs end the run before max_time {budget} would ({self.by_time} steps at"
                f" {self.pace:.1f} steps/s, the pace of {window}): {schedule} fitted to {total} steps"
            )
        return (
            f"schedule: max_time {budget} bounds the run: {schedule} fitted to {total} steps, estimated from the pace"
            f" of {window} ({self.pace:.1f} steps/s)"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_timer(trainer: Trainer) -> Timer | None:
    """The Timer Lightning adds for ``max_time`` (or one the config gives with a duration): None without one."""
    return next((c for c in trainer.callbacks if isinstance(c, Timer) and c.time_remaining() is not None), None)


class PaceMeter:
    """Times this attempt's steps ``steps`` to ``2 * steps`` on TIMER's clock and returns the run's
    ``LengthEstimate``. The first ``steps`` are not timed: they pay the one-time costs (loader workers starting, the
    first validation and checkpoint: 0.3 s on digits, where 50 steps later took 0.1 s), which the pace would
    otherwise spread over the whole run (the first estimate, from steps 1-51, was 1,135 steps of the 2,739 run)."""

    def __init__(self, timer: Timer, bound: int | None, first_step: int, steps: int = PACE_STEPS) -> None:
        self.timer, self.bound, self.steps = timer, bound, steps
        self.window = (first_step + steps, first_step + 2 * steps)  # the steps timed: after start-up
        self.start: float | None = None

    def estimate(self, global_step: int) -> LengthEstimate | None:
        """Called after every optimizer step (GLOBAL_STEP steps taken): the estimate once the window is timed."""
        if global_step < self.window[0]:
            return None
        elapsed = self.timer.time_elapsed()
        if self.start is None:
            self.start = elapsed
            return None
        if global_step < self.window[1]:
            return None
        left = self.timer.time_remaining() or 0.0
        timed = global_step - self.window[0]
        return LengthEstimate(elapsed + left, timed, elapsed - self.start, global_step, left, self.bound)
