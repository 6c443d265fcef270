"""The other end of a run: one line that says where a finished ``fit`` (or ``validate``) left its results.

Lightning ends a fit on "`max_epochs=20` reached", and the run's folder (``version_N``), its checkpoint and its
final metrics are for the user to find. Rank 0 prints them once, after the command has returned normally (a stopped
or failed run says what happened instead: runtime/preemption.py, runtime/faults.py).
"""

import math
from pathlib import Path

import torch
from lightning.pytorch import Trainer

from trainfleet.messages import report

MOST_METRICS = 6  # the line stays a line: validation's metrics first, then the rest, alphabetically


def run_folder(trainer: Trainer) -> Path:
    """Where the run wrote its logs and config: the first logger's folder, or ``default_root_dir`` without one. Rank 0's
    view, read without a collective (the other ranks may have ended)."""
    loggers = trainer.loggers
    folder = getattr(loggers[0], "log_dir", None) or getattr(loggers[0], "save_dir", None) if loggers else None
    return Path(folder or trainer.default_root_dir)


def last_checkpoint(trainer: Trainer) -> str | None:
    """The newest checkpoint the run saved (``last.ckpt`` with ``save_last``), else its best one."""
    callback = trainer.checkpoint_callback
    if callback is None:
        return None
    return getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "") or None


def final_metrics(trainer: Trainer, prefixes: tuple[str, ...] = ("val", "test", "train")) -> str:
    """``val_acc 0.9644, val_loss 0.1187, train_acc ...``: the scalar metrics logged last (reduced across ranks), in
    the order of PREFIXES (the others, such as the learning rate or throughput, only if none has one), at most
    ``MOST_METRICS``."""
    values = {
        name: float(value)
        for name, value in trainer.callback_metrics.items()
        if isinstance(value, (torch.Tensor, float, int)) and (not isinstance(value, torch.Tensor) or value.numel() == 1)
    }
    values = {name: value for name, value in values.items() if not _repeats(name, values)}
    rank = {name: next((i for i, prefix in enumerate(prefixes) if name.startswith(prefix)), None) for name in values}
    if any(order is not None for order in rank.values()):
        values = {name: value for name, value in values.items() if rank[name] is not None}
    names = sorted(values, key=lambda name: (rank[name] if rank[name] is not None else 0, name))[:MOST_METRICS]
    return ", ".join(f"{name} {_number(values[name])}" for name in names)


def _repeats(name: str, values: dict[str, float]) -> bool:
    """``train_loss_step`` beside ``train_loss``: Lightning's per-step copy of a metric logged on both."""
    return name.endswith("_step") and name.removesuffix("_step") in values


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) and value != 0 else str(value)


def say_fit_ended(trainer: Trainer) -> None:
    """``[project] fit ended (20 epochs, 400 steps): run folder ...; last checkpoint ...; val_acc 0.96, ...``."""
    if not trainer.is_global_zero:
        return
    parts = [f"run folder {run_folder(trainer)}"]
    if (checkpoint := last_checkpoint(trainer)) is not None:
        parts.append(f"last checkpoint {checkpoint}")
    if metrics := final_metrics(trainer):
        parts.append(metrics)
    epochs, steps = trainer.current_epoch, trainer.global_step
    done = f"{epochs} epoch{'s' if epochs != 1 else ''}, {steps} step{'s' if steps != 1 else ''}"
    report(f"fit ended ({done}): {'; '.join(parts)}")


def say_validate_ended(trainer: Trainer, checkpoint: str | None) -> None:
    """``[project] validate ended (.../last.ckpt): val_acc 0.96, val_loss 0.12``."""
    if trainer.is_global_zero:
        of = f" ({checkpoint})" if checkpoint else ""
        report(f"validate ended{of}: {final_metrics(trainer) or 'no metrics logged'}")
