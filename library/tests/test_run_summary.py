"""A finished run's one line (runs/summary.py): which metrics it names, and how. The line itself, at the end of a
real fit and validate: tests/test_run_lock.py."""

from types import SimpleNamespace

import torch

from trainfleet.runs.summary import final_metrics


def test_the_final_metrics_are_validations_then_trainings_without_lightnings_per_step_copies():
    metrics = {
        "train_loss": torch.tensor(0.25),
        "train_loss_step": torch.tensor(0.3),
        "val_acc": torch.tensor(0.96444),
        "lr-SGD": torch.tensor(0.001),
        "samples_per_sec": torch.tensor(61350.0),
        "confusion": torch.ones(2, 2),  # not a scalar
    }
    trainer = SimpleNamespace(callback_metrics=metrics)
    assert final_metrics(trainer) == "val_acc 0.9644, train_loss 0.25"
    trainer.callback_metrics = {"lr-SGD": torch.tensor(0.001), "samples_per_sec": torch.tensor(0.0)}
    assert final_metrics(trainer) == "lr-SGD 0.001, samples_per_sec 0.0"  # none with a prefix: the others
