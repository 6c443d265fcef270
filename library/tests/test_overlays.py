"""Every overlay under configs/ combines with configs/digits.yaml and with every other overlay that sets a key it sets
(to the second level: ``trainer.logger``, ``data.init_args``), keeping what each adds: a list an overlay extends
(``callbacks+:``, ``logger+:``, jsonargparse's list append) keeps every item whatever the order; a value an overlay
chooses (the data set, the strategy, the first logger) is the later overlay's when both choose it. Overlays that set
disjoint keys merge key by key, which each one with the base config shows. Parse only (``--print_config``),
in-process: no run."""

import contextlib
import io
import itertools
import sys

import pytest
from helpers import DIGITS_CONFIG, REPO
from jsonargparse._loaders_dumpers import yaml_load  # jsonargparse's own reading: "0:05:00" stays a string

from trainfleet.main import main

NOT_OVERLAYS = {"digits.yaml", "sweep.yaml"}  # the base config, and a search space for `sweep`
OVERLAYS = sorted(path.name for path in (REPO / "configs").glob("*.yaml") if path.name not in NOT_OVERLAYS)
APPEND = "+"


def load(name: str) -> dict:
    return yaml_load((REPO / "configs" / name).read_text())


def leaves(config: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """The overlay's settings by key path; a list appended to (``key+``) is one leaf whose path ends with ``+``."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat |= leaves(value, (*prefix, key))
        else:
            flat[(*prefix, key)] = value
    return flat


def at(config: dict, path: tuple) -> object:
    for key in path:
        config = config[0] if isinstance(config, list) else config  # one value appended to: the list's first item
        config = config[key]
    return config


def class_paths(items: object) -> list[str]:
    return [item["class_path"] for item in (items if isinstance(items, list) else [items]) if isinstance(item, dict)]


def overridden(path: tuple, later: dict[tuple, object]) -> bool:
    """Whether a later overlay replaces PATH's value: it sets PATH, a key above it, or another class there (whose
    init_args are its own)."""
    path = tuple(key.rstrip(APPEND) for key in path)
    return any(
        path[: len(key)] == key or (key[-1] == "class_path" and path[: len(key) - 1] == key[:-1])
        for key in later
        if not key[-1].endswith(APPEND)
    )


def print_config(capsys, *overlays: str) -> dict:
    args = ["fit", "--config", str(DIGITS_CONFIG)]
    for name in overlays:
        args += ["--config", str(REPO / "configs" / name)]
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(io.StringIO()) as stdout:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    return yaml_load(stdout.getvalue())


def assert_kept(config: dict, overlay: str, later: dict[tuple, object]) -> None:
    for path, value in leaves(load(overlay)).items():
        if overridden(path, later):
            continue
        if path[-1].endswith(APPEND):  # every item appended is in the list
            found = class_paths(at(config, (*path[:-1], path[-1][:-1])))
            assert set(class_paths(value)) <= set(found), (overlay, path, found)
        else:
            assert at(config, path) == value, (overlay, path)


@pytest.fixture(autouse=True)
def bare_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["project"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_keeps_the_base_configs_other_settings(capsys, overlay):
    config = print_config(capsys, overlay)
    assert_kept(config, overlay, {})
    assert_kept(config, "digits.yaml", leaves(load(overlay)))


def ordered(pair: tuple[str, str]) -> tuple[str, str]:
    """An overlay that chooses a list (the first logger) before one that appends to it: the chooser replaces the whole
    list, so it comes first (docs/configuration.md)."""
    first, second = pair
    appends = {path[:-1] + (path[-1][:-1],) for path in leaves(load(first)) if path[-1].endswith(APPEND)}
    return (second, first) if appends & set(leaves(load(second))) else pair


def sections(name: str) -> set[tuple]:
    """The overlay's keys to the second level (``("trainer", "logger")``), an appended list's as its own."""
    return {tuple(key.rstrip(APPEND) for key in path[:2]) for path in leaves(load(name))}


SHARING = [ordered(pair) for pair in itertools.combinations(OVERLAYS, 2) if sections(pair[0]) & sections(pair[1])]


def test_the_overlays_that_share_keys_include_each_kind_of_choice():
    """The pairs below cover every key two overlays choose: the data set, the strategy, the loggers, the callbacks."""
    shared = set().union(*(sections(first) & sections(second) for first, second in SHARING))
    assert {("data", "class_path"), ("trainer", "strategy"), ("trainer", "logger"), ("trainer", "callbacks")} <= shared


@pytest.mark.parametrize("pair", SHARING, ids="+".join)
def test_every_two_overlays_combine_keeping_what_each_adds(capsys, pair):
    first, second = pair
    config = print_config(capsys, first, second)
    assert_kept(config, second, {})
    assert_kept(config, first, leaves(load(second)))


def test_appending_overlays_keep_every_item_in_either_order(capsys):
    """best.yaml's EarlyStopping and ema.yaml's averaging both stay, whichever comes last."""
    assert not [name for name in OVERLAYS if ("trainer", "callbacks") in leaves(load(name))]  # each appends its own
    for order in (("best.yaml", "ema.yaml", "grad_norm.yaml"), ("grad_norm.yaml", "ema.yaml", "best.yaml")):
        config = print_config(capsys, *order)
        found = class_paths(config["trainer"]["callbacks"])
        assert sorted(found) == [
            "lightning.pytorch.callbacks.EMAWeightAveraging",
            "lightning.pytorch.callbacks.EarlyStopping",
            "project.callbacks.GradientNorm",
        ]
    config = print_config(capsys, "wandb.yaml", "mlflow.yaml")
    assert class_paths(config["trainer"]["logger"]) == [
        "trainfleet.runs.loggers.CSVLogger",
        "lightning.pytorch.loggers.WandbLogger",
        "lightning.pytorch.loggers.MLFlowLogger",
    ]
