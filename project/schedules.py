"""Learning-rate schedules whose length is the run's: set by the module from the Trainer, never kept by hand."""

import math
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler


class WarmupCosineLR(LRScheduler):
    """Linear warm-up, then cosine decay to ``eta_min`` at the end of the run; stepped after every optimizer step.

    At step ``t`` (optimizer steps taken), with ``W = warmup_steps`` and ``T = total_steps``::

        t < W:  lr = base_lr * (t + 1) / W
        t >= W: lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * min(t - W, T - W) / (T - W))) / 2

    torch has the two parts (``LinearLR``, ``CosineAnnealingLR``) but they need ``T`` when built, and the run's
    length is known only once its training data is loaded: ``ClassificationModule`` sets ``total_steps`` then
    (``trainer.estimated_stepping_batches``: ``max_epochs``, ``max_steps``, gradient accumulation), unless given.
    The learning rate is a function of ``t`` alone, so a resumed run continues on the same curve.

    A run bounded by ``max_time`` has no length in steps until its pace is known (``time_budget.py``): the schedule is
    provisional (``hold``: the step bound, if any, else the cosine's start held at ``base_lr``) until the module fits
    it once, after timing the first steps. ``estimate`` records how (a dict, in ``state_dict`` and so in every
    checkpoint): a resumed run keeps the length instead of estimating again, and its rates are the same.

    Args:
        optimizer: the module's optimizer.
        warmup_steps: steps of linear warm-up (0: none).
        total_steps: the run's length in steps; ``None``: the Trainer's.
        eta_min: the learning rate at the end of the run.
    """

    def __init__(
        self, optimizer: Optimizer, warmup_steps: int = 0, total_steps: int | None = None, eta_min: float = 0.0
    ) -> None:
        if warmup_steps < 0 or (total_steps is not None and total_steps <= warmup_steps):
            raise ValueError(f"need 0 <= warmup_steps < total_steps; got {warmup_steps} and {total_steps}")
        if not eta_min >= 0:  # a negative learning rate at the end: SGD would climb the loss
            raise ValueError(f"eta_min (the learning rate at the end) must be >= 0, got {eta_min}")
        self.warmup_steps = warmup_steps
        self.user_total_steps = total_steps
        self.total_steps = total_steps
        self.eta_min = eta_min
        self.provisional = False  # the length is not known yet: a max_time run before its pace is measured
        self.estimate: dict[str, Any] | None = None  # how a max_time run's length was estimated (time_budget.py)
        super().__init__(optimizer)

    def fit_to(self, total_steps: int, estimate: dict[str, Any] | None = None) -> None:
        """Ends the schedule after ``total_steps`` steps (the run's length); ESTIMATE: how it was estimated."""
        if total_steps <= self.warmup_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below the run's {total_steps} steps")
        self.total_steps, self.provisional, self.estimate = total_steps, False, estimate

    def hold(self, bound: int | None) -> None:
        """A provisional length until ``fit_to``: BOUND steps (``max_steps``/``max_epochs``'), or with none, the
        cosine's start: ``base_lr`` past the warm-up."""
        if bound is not None:
            self.fit_to(bound)  # a warm-up as long as the bound is refused, as without max_time
        self.total_steps, self.provisional, self.estimate = bound, True, None

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_epoch, base) for base in self.base_lrs]

    def lr_at(self, step: int, base_lr: float) -> float:
        if step < self.warmup_steps:
            return base_lr * (step + 1) / self.warmup_steps
        if step == self.warmup_steps:  # the curve's start needs no length: the scheduler is built before it is known
            return base_lr
        if self.total_steps is None and self.provisional:
            return base_lr
        if self.total_steps is None:
            raise RuntimeError("WarmupCosineLR.total_steps was never set: give it, or train with ClassificationModule")
        decay = self.total_steps - self.warmup_steps
        progress = min(step - self.warmup_steps, decay) / decay
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * progress)) / 2
