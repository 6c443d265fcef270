"""The package's layers: no module imports one that imports it back, ``runs/`` never imports ``runtime/``, and the
commands are one layer (``commands/``) behind one entry point (``__main__``) whose ``--help`` lists them all."""

import ast
import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
from helpers import LIBRARY, REPO

import trainfleet
from trainfleet.main import COMMANDS, main

PACKAGE = trainfleet.__name__
ROOT = LIBRARY / PACKAGE


def module_name(path) -> str:
    parts = path.relative_to(LIBRARY).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def imported(path) -> set[str]:
    """The package's modules PATH imports, at its top or inside functions (``from P import m``: the module m)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE:
            names |= {
                f"{node.module}.{a.name}" if is_module(f"{node.module}.{a.name}") else node.module for a in node.names
            }
    return {name for name in names if name == PACKAGE or name.startswith(f"{PACKAGE}.")}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return {module_name(path): imported(path) for path in sorted(ROOT.rglob("*.py"))}


def test_no_module_imports_one_that_imports_it_back(graph):
    def cycle_from(start: str, module: str, seen: tuple[str, ...]) -> tuple[str, ...] | None:
        for child in sorted(graph.get(module, ())):
            if child == start:
                return (*seen, child)
            if child not in seen and (found := cycle_from(start, child, (*seen, child))):
                return found
        return None

    cycles = {" -> ".join(found) for module in graph if (found := cycle_from(module, module, (module,)))}
    assert cycles == set()


def test_runs_never_imports_runtime_and_only_the_entry_point_imports_the_commands(graph):
    upward = {
        f"{module} -> {name}"
        for module, names in graph.items()
        for name in names
        if module.startswith(f"{PACKAGE}.runs") and name.startswith(f"{PACKAGE}.runtime")
    }
    commands = {
        f"{module} -> {name}"
        for module, names in graph.items()
        for name in names
        if name.startswith(f"{PACKAGE}.commands")
        and not module.startswith(f"{PACKAGE}.commands")
        and module != f"{PACKAGE}.main"
    }
    assert upward == set() and commands == set()


def test_the_entry_points_help_lists_every_command_and_each_command_has_a_main(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # pytest's own arguments are not the CLI's
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    for name, (module, _) in COMMANDS.items():
        assert f"{name}:" in help_text
        assert module.startswith(f"{PACKAGE}.commands.") and callable(importlib.import_module(module).main)
    assert {path.stem for path in (ROOT / "commands").glob("*.py")} - {"__init__"} == set(COMMANDS)


def test_the_users_files_import_none_of_the_machinery(graph):
    """What a user edits (the module, networks, callbacks, data modules) reads as plain Lightning: no runtime/, runs/,
    checkpoints/, commands/ or private-API module; the machinery comes to it (e.g. the FSDP2 strategy, through
    ``ShardsNetworks``)."""
    users = [REPO / "project" / f"{name}.py" for name in ("module", "networks", "callbacks", "data", "schedules")]
    machinery = tuple(f"{PACKAGE}.{name}" for name in ("runtime", "runs", "checkpoints", "commands"))
    reached = {f"{path.stem} -> {name}" for path in users for name in imported(path) if name.startswith(machinery)}
    assert reached == set()


# What runs before torch is imported: Ctrl-C and SLURM's requeue signal are caught from the command's first line,
# seconds before torch's import ends on a busy node.
BEFORE_TORCH = {f"{PACKAGE}{name}" for name in ("", ".main", ".program", ".exit_codes", ".runtime")}
BEFORE_TORCH |= {f"{PACKAGE}.runtime.early_interrupt", f"{PACKAGE}.runtime.requeue_signal", "project.__main__"}


def test_what_runs_before_torch_imports_only_the_standard_library_and_itself():
    for name in sorted(BEFORE_TORCH):
        tree = ast.parse(Path(importlib.util.find_spec(name).origin).read_text())
        imported = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
        imported += [node.module for node in tree.body if isinstance(node, ast.ImportFrom)]  # module level only
        heavy = [module for module in imported if module not in BEFORE_TORCH | set(sys.stdlib_module_names)]
        assert heavy == [], name


def test_the_map_names_every_module_of_the_package():
    """docs/architecture.md has a line for each module: a new one gets its line, a removed one loses it."""
    text = (LIBRARY / "docs" / "architecture.md").read_text()
    modules = [path for path in ROOT.rglob("*.py") if path.name != "__init__.py"]
    assert [
        str(path.relative_to(REPO)) for path in modules if f"`{path.name}`" not in text and f"/{path.name}`" not in text
    ] == []
