"""Every numeric argument of Lightning's ``Trainer``, classified by its meaning, and refused outside its range before
anything starts (``checks.py``: the CLI exits 2 naming the key, the range and the value).

A table driven by the signature, not a check per mistake once found: ``val_check_interval 0`` and
``check_val_every_n_epoch 0`` reached a modulo by zero in Lightning's training loop (a 51-line traceback, exit 1),
``num_sanity_val_steps -3`` was taken as it was, and ``accumulate_grad_batches 0`` had been found the same way
before. ``numeric_arguments`` lists the signature's numeric arguments and ``tests/test_trainer_ranges.py`` fails on
one this table does not classify: a new Lightning argument gets a range the day it appears.

The kinds: a ``Count`` (an integer from ``low``; a divisor from 1; -1 where Lightning documents it as "all" or "no
limit"), an ``Amount`` (a real number from ``low``), ``Batches`` (a count of batches from ``low``, or a fraction of
them in [0, 1], (0, 1] for a divisor; ``val_check_interval`` also takes a time, which must be positive), and
``Unchecked`` (Lightning or the parser refuses a wrong value itself, with a message naming it: said why).
"""

import inspect
import math
import types
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Union, get_args, get_origin

from jsonargparse import Namespace


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Count:
    """An integer from LOW; SPECIAL: values below LOW that mean something ({-1: "no limit"}); NOTE: what a value
    means, said in the message."""

    low: int
    special: dict[int, str] = field(default_factory=dict)
    note: str = ""

    def problem(self, key: str, value: Any) -> str | None:
        if not is_number(value) or value >= self.low or value in self.special:
            return None
        others = "".join(f" or {number} ({meaning})" for number, meaning in self.special.items())
        note = f" ({self.note})" if self.note else ""
        return f"{key} must be >= {self.low}{note}{others}, got {value}"


@dataclass(frozen=True)
class Amount:
    """A real number from LOW."""

    low: float
    note: str = ""

    def problem(self, key: str, value: Any) -> str | None:
        if not is_number(value) or value >= self.low:
            return None
        return f"{key} must be >= {self.low:g}{f' ({self.note})' if self.note else ''}, got {value}"


@dataclass(frozen=True)
class Batches:
    """A number of batches from LOW (an int, or a whole float, as Lightning takes 2.0 as 2) or a fraction of them: a
    float in [0, 1] ((0, 1] where LOW is 1: a divisor). TIMED: a time (``DD:HH:MM:SS``, a mapping) is also taken, and
    must be positive."""

    low: int
    note: str = ""
    timed: bool = False

    def problem(self, key: str, value: Any) -> str | None:
        if self.timed and (seconds := duration_seconds(value)) is not None:
            return None if seconds > 0 else f"{key} must be a positive time, got {value}"
        if not is_number(value) or self.fits(value):
            return None
        fraction = "(0, 1]" if self.low else "[0, 1]"
        note = f" ({self.note})" if self.note else ""
        return f"{key} must be a fraction of the batches in {fraction} or a count >= {self.low}{note}, got {value}"

    def fits(self, value: float) -> bool:
        if isinstance(value, int):
            return value >= self.low
        fraction = 0 < value <= 1 if self.low else 0 <= value <= 1
        return fraction or (math.isfinite(value) and value == int(value) and value >= max(self.low, 1))


@dataclass(frozen=True)
class Unchecked:
    """Not checked here: WHY (Lightning, or the parser, refuses a wrong value itself, naming it)."""

    why: str

    def problem(self, key: str, value: Any) -> None:
        return None


def duration_seconds(value: Any) -> float | None:
    """VALUE's seconds where it is a time as Lightning reads ``val_check_interval``'s (``DD:HH:MM:SS``, a mapping of
    ``timedelta``'s arguments); None for anything else (a number; a malformed one Lightning refuses itself)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    try:
        if isinstance(value, str) and len(parts := value.split(":")) == 4:
            days, hours, minutes, seconds = map(int, parts)
            return days * 86400 + hours * 3600 + minutes * 60 + seconds
        if isinstance(value, (dict, Namespace)):
            return timedelta(**dict(value.items())).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return None


Rule = Count | Amount | Batches | Unchecked

TRAINER_RANGES: dict[str, Rule] = {
    "devices": Unchecked("Lightning refuses 0 and below -1 itself; its meaning depends on the accelerator"),
    "num_nodes": Unchecked("Lightning refuses it below 1 itself: `num_nodes` must be a positive integer"),
    "precision": Unchecked("one of fixed values: the parser refuses any other"),
    "fast_dev_run": Count(0, note="true: 1 batch of each; N: N batches"),
    "max_epochs": Count(0, {-1: "until max_steps or max_time"}),
    "min_epochs": Count(0),
    "max_steps": Count(0, {-1: "no limit"}),
    "min_steps": Count(0),
    "limit_train_batches": Batches(0),
    "limit_val_batches": Batches(0, "0: no validation"),
    "limit_test_batches": Batches(0),
    "limit_predict_batches": Batches(0),
    "overfit_batches": Batches(0, "0: off"),
    "val_check_interval": Batches(1, "validation every so many training batches", timed=True),
    "check_val_every_n_epoch": Count(1, note="null: by val_check_interval alone"),
    "num_sanity_val_steps": Count(0, {-1: "every validation batch"}),
    "log_every_n_steps": Count(0),
    "accumulate_grad_batches": Count(1, note="1: no accumulation"),
    "gradient_clip_val": Amount(0, "0 or null: no clipping"),
    "reload_dataloaders_every_n_epochs": Count(0, note="0: never"),
}


def is_numeric(annotation: Any) -> bool:
    """Whether an argument of ANNOTATION may be a number: int or float (not bool), a Literal of numbers, or a Union
    with one of those (not inside a container: ``dict[str, int]`` is a mapping)."""
    if annotation in (int, float):
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return any(is_number(choice) for choice in get_args(annotation))
    if origin in (Union, types.UnionType):
        return any(is_numeric(member) for member in get_args(annotation))
    return False


def numeric_arguments(function: Any) -> list[str]:
    """The arguments of FUNCTION (a class's ``__init__``) that may be numbers, in the signature's order."""
    return [
        name for name, parameter in inspect.signature(function).parameters.items() if is_numeric(parameter.annotation)
    ]


def trainer_ranges_problem(trainer: Namespace, prefix: str = "trainer.") -> str | None:
    """The first of TRAINER's (the config's ``trainer`` section) numeric arguments outside its range, or None."""
    for name, rule in TRAINER_RANGES.items():
        if (problem := rule.problem(prefix + name, trainer.get(name))) is not None:
            return problem
    return None
