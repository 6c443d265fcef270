"""Lightning's per-call overhead in every training step, removed where it buys nothing.

Lightning calls about ten hooks a step, each on the LightningModule and on every callback, through a profiler
context named after the hook (``trainer/call.py``). On a 1 ms CPU step those calls cost more than the template's own
work. Lightning skips a hook attribute that is not callable, and asks ``trainer.profiler`` for each context: so hooks
inherited as no-ops are hidden behind ``None`` on the instance, and the default "no profiler" hands out one shared
context instead of building a generator-based one per call. What a hook does is never changed.
"""

import contextlib
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import PassThroughProfiler

# The hooks Lightning calls on the module and on every callback at every training step (no-ops by default).
TRAINING_STEP_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward")
TRAINING_STEP_HOOKS += ("on_before_optimizer_step", "on_before_zero_grad")
# At every evaluation batch: hidden on callbacks only, as Lightning reads the module's signatures (dataloader_idx).
EVALUATION_BATCH_HOOKS = tuple(
    f"{stage}_batch_{when}" for stage in ("on_validation", "on_test", "on_predict") for when in ("start", "end")
)


class NoProfiler(PassThroughProfiler):
    """Lightning's default profiler (none): ``profile`` returns one shared empty context instead of a new generator
    context per hook call (about 1 us each, some 25 a step). A profiler set in the config replaces it as usual."""

    _context = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext:  # type: ignore[override]
        return self._context


def skip_empty_batch_hooks(trainer: Trainer) -> None:
    """Hides the batch hooks each callback, and the training-step hooks the module, inherit as no-ops behind ``None``
    on the instance.

    Each call Lightning skips saves its profiler context, the callback's state key (which ``ModelCheckpoint`` rebuilds
    as a string) and the call: about 4 us with Lightning's default profiler.
    """
    owners: list[tuple[Any, type, tuple[str, ...]]] = [
        (callback, Callback, TRAINING_STEP_HOOKS + EVALUATION_BATCH_HOOKS) for callback in trainer.callbacks
    ]
    if isinstance(trainer.lightning_module, LightningModule):
        owners.append((trainer.lightning_module, LightningModule, TRAINING_STEP_HOOKS))
    for owner, base, hooks in owners:
        for hook in hooks:
            if getattr(type(owner), hook) is getattr(base, hook):
                setattr(owner, hook, None)


def skip_idle_checkpoint_hooks(callbacks: Sequence[Callback]) -> None:
    """Hides the ``ModelCheckpoint`` hooks that cannot save with its settings, the same way.

    At every batch end it checks its step and time triggers (about 15 us with Lightning's call), and at every epoch end
    it deep-copies the logged metrics as monitor candidates (about 0.4 ms) even when it saves nothing: the batch hook
    goes without ``every_n_train_steps`` or ``train_time_interval``; the epoch hooks go with ``save_top_k: 0`` and
    ``save_last: false`` (how the benchmark turns checkpoints off, as the CLI always adds the callback).
    """
    for callback in callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback._every_n_train_steps < 1 and callback._train_time_interval is None:
            callback.on_train_batch_end = None
        if callback.save_top_k == 0 and not callback.save_last:
            callback.on_train_epoch_end = callback.on_validation_end = None
