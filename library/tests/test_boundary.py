"""Lightning's private API is reached from one module only, and that module checks at start-up, by name, every private
name it reaches. No other private API of a library (Optuna's) is reached at all."""

import ast
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
import sys
import warnings
from pathlib import Path

import project
import pytest
from helpers import DIGITS_CONFIG, LIBRARY, REPO

from trainfleet import lightning_internals as internals

BOUNDARY = Path(internals.__file__)
# Libraries whose private names a module of the project must not reach (Lightning's: only through the boundary).
LIBRARIES = ("lightning", "optuna")


def project_files() -> list[Path]:
    return sorted(
        path for root in (REPO / "project", LIBRARY / "trainfleet") for path in root.rglob("*.py") if path != BOUNDARY
    )


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def defined_names(tree: ast.AST) -> set[str]:
    """Private names the file defines itself: functions, classes, module variables, attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_self(node.value):
            names.add(node.attr)
    return {name for name in names if private(name)}


@functools.cache
def library_private_names() -> frozenset[str]:
    """Private names the LIBRARIES define: their functions, classes, module variables and instance attributes."""
    definition = re.compile(r"(?:def |class |self\.|^\s*)(_[A-Za-z0-9_]+)\s*[(=:]", re.MULTILINE)
    roots = [Path(spec.origin).parent for name in LIBRARIES if (spec := importlib.util.find_spec(name))]
    names = (name for root in roots for path in root.rglob("*.py") for name in definition.findall(path.read_text()))
    return frozenset(name for name in names if private(name))


def reaches_into_lightning(path: Path) -> list[str]:
    """What PATH reaches of the libraries' privates: imports of private names or modules, and attributes (or getattr
    names) that a library defines as private and the file does not define itself."""
    tree = ast.parse(path.read_text())
    own = defined_names(tree)
    theirs = library_private_names()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(LIBRARIES):
            parts = node.module.split(".") + [alias.name for alias in node.names]
            found += [f"imports {node.module}.{part}" for part in parts if private(part)]
        elif isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.startswith(LIBRARIES) and "._" in a.name]
        elif isinstance(node, ast.Attribute) and node.attr in theirs and node.attr not in own:
            found.append(f"uses .{node.attr} (line {node.lineno})")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value in theirs
            and node.args[1].value not in own
        ):
            found.append(f"{node.func.id}(..., {node.args[1].value!r}) (line {node.lineno})")
    return found


def test_no_module_but_the_boundary_reaches_into_a_librarys_private_api():
    reaching = {
        str(path.relative_to(REPO)): found for path in project_files() if (found := reaches_into_lightning(path))
    }
    assert reaching == {}


def test_no_class_overrides_a_private_member_of_lightnings_or_subclasses_a_private_class_but_through_the_boundary():
    allowed_bases = {value for value in vars(internals).values() if isinstance(value, type)}
    offences = []
    for module_info in pkgutil.walk_packages(project.__path__, f"{project.__name__}."):
        module = importlib.import_module(module_info.name)
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == module.__name__) or module is internals:
                continue
            lightning_bases = [base for base in cls.__mro__[1:] if base.__module__.startswith("lightning")]
            offences += [
                f"{cls.__qualname__} subclasses {base.__qualname__}"
                for base in cls.__bases__
                if base.__module__.startswith("lightning") and private(base.__name__) and base not in allowed_bases
            ]
            offences += [
                f"{cls.__qualname__}.{name} overrides Lightning's"
                for name in vars(cls)
                if private(name) and name != "_abc_impl" and any(name in vars(base) for base in lightning_bases)
            ]
    assert offences == []


def test_the_check_finds_every_part_in_the_installed_lightning():
    internals.missing_parts.cache_clear()
    assert internals.missing_parts() == ()
    assert all(line.lstrip().startswith("ok") for line in internals.report())


def names_in(tree: ast.AST) -> set[str]:
    """Every name the boundary's code mentions: attributes, definitions, names, and the ``lookup`` paths' last parts."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return names | looked_up(tree)


def looked_up(tree: ast.AST) -> set[str]:
    """The last parts of the paths the boundary passes to ``lookup`` as text."""
    return {
        node.args[0].value.rpartition(":")[2].rpartition(".")[2]
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lookup"
        if isinstance(node.args[0], ast.Constant)
    }


def test_every_private_name_the_boundary_reaches_is_one_its_parts_check_and_every_checked_name_is_used():
    tree = ast.parse(BOUNDARY.read_text())
    declared = {path.rpartition(":")[2].rpartition(".")[2] for part in internals.PARTS for path in part.names}
    reached = {line.split(".")[-1].split(" ")[0] for line in reaches_into_lightning(BOUNDARY)}
    overridden = {  # private methods of Lightning's that a class here replaces
        node.name
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and private(node.name)
    }
    assert (reached | looked_up(tree) | overridden) - declared == set()
    used_by_code = {  # not the names a part checks that one of Lightning's functions uses (an order relied on)
        path.rpartition(".")[2]
        for part in internals.PARTS
        for path in part.names
        if not inspect.isfunction(internals.lookup(path.rpartition(".")[0]))
    }
    assert {name for name in used_by_code if private(name)} - names_in(tree) == set()
    assert all(
        path.count(":") == 1 and path.startswith("lightning.") for part in internals.PARTS for path in part.names
    )


def test_a_name_is_found_on_its_owner_or_as_an_attribute_its_methods_assign():
    assert internals.found("lightning.pytorch.trainer.trainer:Trainer._signal_connector")  # set in __init__
    assert internals.found("lightning.pytorch.trainer.call:_call_and_handle_interrupt")
    assert not internals.found("lightning.pytorch.trainer.trainer:Trainer._signal_connector_renamed")
    assert not internals.found("lightning.pytorch.trainer.call:_renamed")
    assert not internals.found("lightning.no_such_module:Owner._name")
    assert internals.found("lightning.pytorch.loops.fit_loop:_FitLoop.reset.is_last_batch")  # a name the method uses
    assert not internals.found("lightning.pytorch.loops.fit_loop:_FitLoop.reset._not_used_there")


def fit_exit(args: list[str]) -> int:
    from trainfleet.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code


def test_a_correctness_part_gone_from_lightning_stops_the_cli_at_start_up_with_exit_2(monkeypatch, capsys, tmp_path):
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    monkeypatch.delattr(_SignalConnector, "_sigterm_notifier_fn")
    internals.missing_parts.cache_clear()
    try:
        code = fit_exit(["fit", "--config", str(DIGITS_CONFIG), "--trainer.default_root_dir", str(tmp_path)])
    finally:
        monkeypatch.undo()
        internals.missing_parts.cache_clear()
    assert code == 2
    error = capsys.readouterr().err
    assert "SIGTERM preemption" in error and "_SignalConnector._sigterm_notifier_fn" in error
    assert "mend trainfleet/lightning_internals.py" in error
    assert not any(tmp_path.iterdir())  # nothing written


def test_speed_parts_gone_from_lightning_fall_back_to_lightnings_own_behaviour_with_one_warning_each(
    monkeypatch, tmp_path
):
    """Lightning fixing its per-step SIGTERM broadcast (dropping the method) must not stop the template."""
    import lightning.fabric.strategies.launchers.subprocess_script as fabric_launcher
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    from trainfleet.cli import build_cli

    monkeypatch.setattr(sys, "argv", sys.argv[:1])
    monkeypatch.delattr(fabric_launcher, "_launch_process_observer")
    monkeypatch.delattr(_TrainingEpochLoop, "_broadcast_sigterm_tensor")
    internals.missing_parts.cache_clear()
    args = ["--config", str(DIGITS_CONFIG), "--trainer.default_root_dir", str(tmp_path), "--trainer.devices", "2"]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cli = build_cli(args, run=False)
        internals.take_over_signals(cli.trainer, on_sigterm=print, on_requeue=print)
    finally:
        monkeypatch.undo()
        internals.missing_parts.cache_clear()
    mend = "mend trainfleet/lightning_internals.py"
    messages = [str(warning.message) for warning in caught if mend in str(warning.message)]
    assert len(messages) == 2
    assert any("local CPU ranks forked" in message and "_launch_process_observer" in message for message in messages)
    assert any("no SIGTERM broadcast" in message and "_broadcast_sigterm_tensor" in message for message in messages)
    assert type(cli.trainer.strategy.launcher).__name__ == "_SubprocessScriptLauncher"  # Lightning's own
    assert "_broadcast_sigterm_tensor" not in vars(cli.trainer.fit_loop.epoch_loop)  # Lightning's own, untouched


def test_the_jsonargparse_texts_that_errors_py_reads_are_in_the_installed_jsonargparse():
    """trainfleet/errors.py explains jsonargparse's messages by their words: a reworded message would lose its
    explanation without a failure elsewhere."""
    from trainfleet.errors import JSONARGPARSE_TEXTS

    root = Path(importlib.util.find_spec("jsonargparse").origin).parent
    source = "".join(path.read_text() for path in root.rglob("*.py"))
    assert [text for text in JSONARGPARSE_TEXTS if text not in source] == []
