"""A callback hook is called on the callbacks that override it only, for the template's trainers
(lightning_internals.py): the overridden ones run as before, every time, with the hook's name set for their
``self.log``; a trainer the template did not build, or one that profiles, is Lightning's own."""

import weakref
from collections import Counter

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.profilers import SimpleProfiler

from trainfleet import lightning_internals as internals

STEPS = 5


class Tiny(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> torch.utils.data.DataLoader:
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(STEPS * 2, 2)), batch_size=2)


class CountsBackward(Callback):
    def __init__(self) -> None:
        self.calls = 0

    def on_before_backward(self, *args: object) -> None:
        self.calls += 1


class LogsAtBatchEnd(Callback):
    """``self.log`` from a callback's hook: Lightning checks it against the hook its loop says is running."""

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: object) -> None:
        pl_module.log("logged_by_a_callback", float(trainer.global_step))


class Watched(Callback):
    """Overrides nothing; counts the look-ups of its hooks (Lightning's loop looks each one up at every call)."""

    def __init__(self) -> None:
        self.looked_up: Counter = Counter()

    def __getattribute__(self, name: str) -> object:
        if name.startswith("on_"):
            object.__getattribute__(self, "looked_up")[name] += 1
        return object.__getattribute__(self, name)


def fit(skip: bool, **trainer_args: object) -> tuple[list[Callback], weakref.ref]:
    """Fits Tiny with five callbacks (and a progress bar, which holds the trainer); the callbacks, and a weak
    reference to the trainer."""
    by_instance = Callback()
    by_instance.calls = 0
    by_instance.on_after_backward = lambda *args: setattr(by_instance, "calls", by_instance.calls + 1)
    callbacks = [CountsBackward(), by_instance, LogsAtBatchEnd(), Watched(), Callback()]
    trainer = Trainer(
        max_steps=STEPS, logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
        **trainer_args,
    )  # fmt: skip
    if skip:
        internals.skip_idle_callback_hooks(trainer)
    trainer.fit(Tiny())
    assert trainer.callback_metrics["logged_by_a_callback"] == STEPS  # its hook's name was set around its call
    return callbacks, weakref.ref(trainer)


def test_each_hook_is_called_on_the_callbacks_that_override_it_only_and_every_time():
    callbacks, trainer = fit(skip=True)
    by_class, by_instance, _, watched, *_ = callbacks
    assert by_class.calls == STEPS and by_instance.calls == STEPS  # overridden on the class and on an instance
    # A callback that overrides nothing is looked at once per hook (which callbacks override it), not once a call.
    assert watched.looked_up["on_before_backward"] == watched.looked_up["on_before_optimizer_step"] == 1
    assert watched.looked_up["on_train_batch_end"] == 1
    seen, overriding = internals._idle_hooks[trainer()]  # what is kept per trainer: ids and positions, no object
    assert seen == tuple(map(id, trainer().callbacks))  # that could hold it alive (a progress bar holds its trainer)
    assert all(type(position) is int for positions in overriding.values() for position in positions)
    assert overriding["on_before_backward"] == (0,) and overriding["on_before_zero_grad"] == ()


@pytest.mark.parametrize("trainer_args", [{}, {"profiler": SimpleProfiler()}], ids=["not-the-templates", "profiling"])
def test_a_trainer_the_template_did_not_build_or_one_that_profiles_calls_every_callback(trainer_args):
    callbacks, _ = fit(skip="profiler" in trainer_args, **trainer_args)
    by_class, by_instance, _, watched, *_ = callbacks
    assert by_class.calls == by_instance.calls == STEPS
    assert watched.looked_up["on_before_optimizer_step"] == watched.looked_up["on_before_zero_grad"] == STEPS
