"""Every numeric argument of the Trainer and of the template's own classes has a range, refused outside it before
anything starts (trainfleet/trainer_ranges.py, the constructors): a new argument without one fails here."""

import sys

import pytest
import torch
from helpers import quick_args
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from project.data import DigitsDataModule
from project.module import ClassificationModule
from project.networks import MLP, SmallCNN, TorchvisionModel
from project.schedules import WarmupCosineLR
from test_cli_errors import ONE_SCREEN, _refused
from torch import nn

from trainfleet.checkpoints.periodic import PeriodicCheckpoint
from trainfleet.data.base import MAX_SEED
from trainfleet.runtime.preemption import PreemptionCheck
from trainfleet.trainer_ranges import TRAINER_RANGES, Count, Unchecked, numeric_arguments, trainer_ranges_problem


@pytest.fixture(autouse=True)
def bare_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["project"])


def test_every_numeric_argument_of_the_trainer_has_a_range():
    """A new Lightning argument that may be a number needs a classification (TRAINER_RANGES) the day it appears."""
    numeric = numeric_arguments(Trainer.__init__)
    unclassified = [name for name in numeric if name not in TRAINER_RANGES]
    assert not unclassified, f"classify in trainfleet/trainer_ranges.py: {unclassified}"
    assert not set(TRAINER_RANGES) - set(numeric), "no longer numeric arguments of the Trainer"
    assert {"val_check_interval", "check_val_every_n_epoch", "num_sanity_val_steps", "precision"} <= set(numeric)
    assert not {"max_time", "enable_checkpointing", "inference_mode", "logger"} & set(numeric)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--trainer.val_check_interval", "0"],
            "trainer.val_check_interval must be a fraction of the batches in (0, 1] or a count >= 1",
        ),
        (
            ["--trainer.check_val_every_n_epoch", "0"],
            "trainer.check_val_every_n_epoch must be >= 1 (null: by val_check_interval alone), got 0",
        ),
        (
            ["--trainer.num_sanity_val_steps", "-3"],
            "trainer.num_sanity_val_steps must be >= 0 or -1 (every validation batch), got -3",
        ),
        (["--trainer.limit_train_batches", "1.5"], "trainer.limit_train_batches must be a fraction of the batches in"),
        (["--trainer.max_steps", "-2"], "trainer.max_steps must be >= 0 or -1 (no limit), got -2"),
        (["--trainer.reload_dataloaders_every_n_epochs", "-1"], "reload_dataloaders_every_n_epochs must be >= 0"),
        (["--model.label_smoothing", "1.5"], "model.label_smoothing must be in [0, 1] (0: none), got 1.5"),
        (["--model.network.init_args.hidden_sizes", "[64, -1]"], "hidden_sizes must each be >= 1, got [64, -1]"),
        (["--data.init_args.seed", str(2**64)], f"seed must be in [0, {MAX_SEED}], got {2**64}"),
    ],
    ids=[
        "val-check-0",
        "check-val-epoch-0",
        "sanity-minus-3",
        "limit-1.5",
        "max-steps",
        "reload",
        "label-smoothing",
        "hidden",
        "seed",
    ],
)
def test_a_number_out_of_its_range_is_refused_before_anything_starts(capsys, tmp_path, flags, message):
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))
    assert message in stderr and len(stderr.splitlines()) <= ONE_SCREEN and "Traceback" not in stderr, stderr


@pytest.mark.parametrize(
    "values",
    [
        {"val_check_interval": 0.5, "check_val_every_n_epoch": None, "num_sanity_val_steps": -1},
        {"val_check_interval": 10, "limit_val_batches": 0, "limit_train_batches": 0.0, "overfit_batches": 2.0},
        {"val_check_interval": "00:00:10:00", "max_epochs": -1, "max_steps": -1, "fast_dev_run": True},
        {"val_check_interval": {"minutes": 1}, "gradient_clip_val": 0, "accumulate_grad_batches": 1},
        {"devices": -1, "precision": 16, "limit_test_batches": 1.0, "limit_predict_batches": 3},
    ],
)
def test_numbers_in_their_ranges_pass(values):
    assert trainer_ranges_problem(Namespace(values)) is None


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"val_check_interval": "00:00:00:00"}, "trainer.val_check_interval must be a positive time, got 00:00:00:00"),
        ({"val_check_interval": 0.0}, "trainer.val_check_interval must be a fraction of the batches in (0, 1]"),
        ({"overfit_batches": -0.5}, "trainer.overfit_batches must be a fraction of the batches in [0, 1]"),
        ({"limit_val_batches": 2.5}, "trainer.limit_val_batches must be a fraction of the batches in [0, 1]"),
        ({"limit_val_batches": float("nan")}, "trainer.limit_val_batches must be a fraction"),
        ({"fast_dev_run": -1}, "trainer.fast_dev_run must be >= 0"),
        ({"min_epochs": -1}, "trainer.min_epochs must be >= 0, got -1"),
        ({"gradient_clip_val": -1e-9}, "trainer.gradient_clip_val must be >= 0 (0 or null: no clipping)"),
    ],
)
def test_numbers_out_of_their_ranges_are_named_with_the_range(values, message):
    problem = trainer_ranges_problem(Namespace(values))
    assert problem is not None and problem.startswith(message), problem


def test_every_kind_but_unchecked_refuses_something():
    """Each classified argument has values it refuses (none is left unchecked by an empty range), and each unchecked
    one says why."""
    for name, rule in TRAINER_RANGES.items():
        if isinstance(rule, Unchecked):
            assert rule.why, name
        else:
            assert rule.problem(name, -(2**40)) is not None, name
    assert Count(1).problem("x", True) is None  # a bool is a switch, not a count (fast_dev_run: true)


# The template's own classes that a config builds: each numeric constructor argument refused out of its range by the
# constructor itself (a wrong value to try and the message's start), or why it has none here.
OWN_CLASSES = {
    ClassificationModule: {"num_classes": "linked from the data", "label_smoothing": (1.5, "model.label_smoothing")},
    MLP: {"num_classes": "linked from the data", "dropout": (1.5, "dropout probability has to be between 0 and 1")},
    SmallCNN: {"num_classes": "linked from the data", "dropout": (-0.1, "dropout probability has to be between")},
    TorchvisionModel: {"num_classes": "linked from the data"},
    WarmupCosineLR: {
        "warmup_steps": (-1, "need 0 <= warmup_steps"),
        "total_steps": (0, "need 0 <= warmup_steps"),
        "eta_min": (-0.1, "eta_min (the learning rate at the end) must be >= 0"),
    },
    PeriodicCheckpoint: {"check_every_n_steps": (0, "periodic.check_every_n_steps must be >= 1")},
    PreemptionCheck: {"check_every_n_steps": (0, "preemption.check_every_n_steps must be >= 1")},
    DigitsDataModule: {
        "batch_size": (0, "batch_size must be >= 1"),
        "val_fraction": (1.0, "need 0 <= val_fraction"),
        "test_fraction": (-0.1, "need 0 <= val_fraction"),
        "split_seed": (-1, "split_seed must be in [0, "),
        "seed": (2**63, "seed must be in [0, "),
        "num_workers": (-1, "num_workers must be between 0"),
        "prefetch_factor": (0, "prefetch_factor must be >= 1"),
        "snapshot_every_n_steps": (0, "snapshot_every_n_steps must be >= 1"),
    },
}


def build(cls: type, name: str, value: object) -> object:
    """CLS built with NAME=VALUE and what else it needs."""
    if cls is ClassificationModule:
        return cls(network=nn.Linear(64, 10), num_classes=10, **{name: value})
    if cls in (MLP, SmallCNN):
        return cls(num_classes=10, input_shape=(1, 8, 8), **{name: value})
    if cls is WarmupCosineLR:
        return cls(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1), **{name: value})
    return cls(**{name: value})


def test_every_numeric_argument_of_the_templates_classes_has_a_range():
    for cls, ranges in OWN_CLASSES.items():
        assert sorted(numeric_arguments(cls.__init__)) == sorted(ranges), f"classify {cls.__qualname__}'s arguments"


@pytest.mark.parametrize(
    ("cls", "name", "value", "message"),
    [
        (cls, name, *rule)
        for cls, ranges in OWN_CLASSES.items()
        for name, rule in ranges.items()
        if isinstance(rule, tuple)
    ],
)
def test_the_templates_classes_refuse_a_number_out_of_its_range(cls, name, value, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        build(cls, name, value)


def test_layer_widths_and_image_sizes_are_refused_below_one():
    with pytest.raises(ValueError, match=r"hidden_sizes must each be >= 1, got \[0\]"):
        MLP(num_classes=10, input_shape=(64,), hidden_sizes=(0,))
    with pytest.raises(ValueError, match=r"channels must each be >= 1, got \[8, -1\]"):
        SmallCNN(num_classes=10, input_shape=(1, 8, 8), channels=(8, -1))
    pytest.importorskip("torchvision")
    from trainfleet.data.transforms import presets

    with pytest.raises(ValueError, match="image_size must be >= 1"):
        presets(0, 0, False, None, None)
    with pytest.raises(ValueError, match="crop_padding must be >= 0"):
        presets(8, -2, False, None, None)
