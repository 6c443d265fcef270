"""The README and docs/ point only at what exists (links, paths, and the names in backticks), and the README stays a
newcomer's page."""

import ast
import contextlib
import functools
import importlib
import inspect
import re
import subprocess
import warnings
from pathlib import Path

import pytest
from helpers import LIBRARY, REPO
from helpers.named_paths import LINK, missing_paths

PAGES = [REPO / "README.md", *sorted((LIBRARY / "docs").glob("*.md"))]


def test_every_path_named_in_docs_and_comments_exists():
    """Links, paths and page names in the pages, comments and docstrings; the template's dated reports name the
    files of their day (a rendered project has none of them: tests/test_template.py checks it the same way)."""
    assert missing_paths(REPO, skip=("library/",)) == {}
    assert missing_paths(LIBRARY, skip=("docs/reports/",), beside=REPO) == {}


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert {Path(link).name for link in LINK.findall(readme) if link.startswith("library/docs/")} == {
        page.name for page in PAGES[1:]
    }


# Code spans in prose (outside fenced blocks) that name an identifier: a class (`NaNGuard`), a function or key with
# an underscore (`prepare_run`, `save_top_k`), a constant (`KNOWN_NOISE`), a call (`check()`), a dotted path, a file.
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
IDENTIFIER = re.compile(r"[A-Za-z_][\w.]*\w(?:\(\))?")
FILE_NAME = re.compile(r"[\w/.-]+\.(?:py|yaml|sh|sbatch|md|toml)")
SOURCE_FILE = re.compile(r"[\w.-]+\.(?:py|sh|sbatch)")  # a bare name that must be one of the repository's files
# Names of things a run or the reader makes, not of code: run folders, the cookiecutter example's package.
EXAMPLES = re.compile(r"version_\d+|my_vision_lab")
# Libraries whose public names the pages use: their module names, classes' members and parameters count as names.
LIBRARIES = (
    "lightning.pytorch",
    "lightning.pytorch.callbacks",
    "lightning.pytorch.loggers",
    "lightning.pytorch.strategies",
    "lightning.pytorch.profilers",
    "lightning.pytorch.plugins",
    "lightning.fabric.plugins.environments",
    "torch",
    "torch.nn",
    "torch.distributed",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.utils.data",
    "torchmetrics",
    "torchmetrics.classification",
    "torchdata.stateful_dataloader",
    "jsonargparse",
)


def named(span: str) -> bool:
    """Whether SPAN reads as the name of something in code, not as a word, value or command."""
    if not IDENTIFIER.fullmatch(span):
        return False
    return span.endswith("()") or any(
        "_" in part.strip("_") or (part[:1].isupper() and not part.isupper()) or (part.isupper() and "_" in part)
        for part in span.removesuffix("()").split(".")
    )


def members(value: object) -> set[str]:
    names = set(dir(value))
    with contextlib.suppress(TypeError, ValueError):
        names |= set(inspect.signature(value).parameters)
    return names


@functools.cache
def known_names() -> frozenset[str]:
    """Every name the project's code, configs and scripts define or use, and the public names of its libraries."""
    names: set[str] = set()
    code = [
        REPO / "project",
        LIBRARY / "trainfleet",
        REPO / "scripts",
        LIBRARY / "scripts",
        LIBRARY / "benchmarks",
        LIBRARY / "tests",
    ]
    for path in [path for folder in code for path in folder.rglob("*.py")]:
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg | ast.keyword) and (name := getattr(node, "arg", None)):
                names.add(name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names |= set(re.findall(r"\w+", node.value))
    others = [*(REPO / "configs").glob("*.yaml"), *(REPO / "scripts").glob("*.s*"), REPO / "pyproject.toml"]
    others += (LIBRARY / "tests" / "fixtures").glob("*.sh")
    names |= {word for path in others for word in re.findall(r"\w+", path.read_text())}
    with warnings.catch_warnings():  # reading deprecated module attributes warns
        warnings.simplefilter("ignore")
        names |= library_names()
    return frozenset(names)


def library_names() -> set[str]:
    names: set[str] = set()
    for module_name in LIBRARIES:
        module = importlib.import_module(module_name)
        names |= set(module_name.split(".")) | members(module)
        for value in vars(module).values():
            if inspect.isclass(value) or inspect.isfunction(value):
                names |= members(value)
                for member in vars(value).values() if inspect.isclass(value) else ():
                    names |= members(member) if inspect.isfunction(member) else set()
    return names


@functools.cache
def repo_file_names() -> frozenset[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return frozenset(name for path in files for name in (path, Path(path).name))


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_name_in_backticks_exists_in_the_code_or_its_libraries(page):
    spans = SPAN.findall(FENCE.sub("", page.read_text()))
    missing = [span for span in spans if SOURCE_FILE.fullmatch(span) and span not in repo_file_names()]
    missing += [
        span
        for span in spans
        if named(span)
        and not FILE_NAME.fullmatch(span)
        and not EXAMPLES.fullmatch(span)
        and not all(part in known_names() for part in span.removesuffix("()").split("."))
    ]
    assert missing == []
