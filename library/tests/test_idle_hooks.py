"""Callback hooks that no callback overrides are skipped for the template's trainers (lightning_internals.py): the
overridden ones run as before, every time, and a trainer the template did not build, or one that profiles, is
Lightning's own."""

import weakref
from collections import Counter

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.profilers import SimpleProfiler
from lightning.pytorch.trainer import call

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


def fit(
    monkeypatch: pytest.MonkeyPatch, skip: bool, **trainer_args: object
) -> tuple[Counter, list[Callback], weakref.ref]:
    """Fits Tiny with three callbacks (and a progress bar, which holds the trainer); the hooks Lightning dispatched to
    the callbacks, counted by name, the callbacks, and a weak reference to the trainer."""
    dispatched: Counter = Counter()
    original = internals._call_callback_hooks

    def counting(trainer: Trainer, hook_name: str, *args: object, **kwargs: object) -> None:
        dispatched[hook_name] += 1
        original(trainer, hook_name, *args, **kwargs)

    monkeypatch.setattr(internals, "_call_callback_hooks", counting)
    monkeypatch.setattr(
        call, "_call_callback_hooks", counting
    )  # restored by monkeypatch when the patch below replaces it
    by_instance = Callback()
    by_instance.calls = 0
    by_instance.on_after_backward = lambda *args: setattr(by_instance, "calls", by_instance.calls + 1)
    callbacks = [CountsBackward(), by_instance, Callback()]
    trainer = Trainer(
        max_steps=STEPS, logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
        **trainer_args,
    )  # fmt: skip
    if skip:
        internals.skip_idle_callback_hooks(trainer)
    trainer.fit(Tiny())
    return dispatched, callbacks, weakref.ref(trainer)


def test_a_hook_no_callback_overrides_is_skipped_and_every_overridden_one_runs_each_time(monkeypatch):
    dispatched, callbacks, trainer = fit(monkeypatch, skip=True)
    by_class, by_instance = callbacks[:2]
    assert by_class.calls == STEPS and by_instance.calls == STEPS  # overridden on the class and on an instance
    assert dispatched["on_before_backward"] == dispatched["on_after_backward"] == STEPS
    assert dispatched["on_before_zero_grad"] == dispatched["on_before_optimizer_step"] == 0  # nobody overrides them
    seen, idle = internals._idle_hooks[trainer()]  # what is kept per trainer: ids and flags, no object that could
    assert seen == tuple(map(id, trainer().callbacks))  # hold it alive (a progress bar holds its trainer)
    assert all(type(value) is bool for value in idle.values())


@pytest.mark.parametrize("trainer_args", [{}, {"profiler": SimpleProfiler()}], ids=["not-the-templates", "profiling"])
def test_a_trainer_the_template_did_not_build_or_one_that_profiles_dispatches_every_hook(monkeypatch, trainer_args):
    skip = "profiler" in trainer_args
    dispatched, (by_class, by_instance, *_), _ = fit(monkeypatch, skip=skip, **trainer_args)
    assert by_class.calls == by_instance.calls == STEPS
    assert dispatched["on_before_optimizer_step"] == dispatched["on_before_zero_grad"] == STEPS
