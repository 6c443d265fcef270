"""The committed lock is the set-up: uv.lock is current, requirements.txt (the pip path) is exactly its export, a lock
that pyproject.toml has moved past is refused with the command that refreshes it, and a Python outside
requires-python is refused at install. Each check runs on a copy of the workspace's files, never on the checkout."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

UV = pytest.importorskip("uv").find_uv_bin()  # the dev extra installs uv
EXPORT = re.compile(r"^#\s+(uv export .*)$", re.MULTILINE)


def uv(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """uv in CWD, with none of the caller's uv settings that would change what it checks (.ci/run sets UV_LOCKED)."""
    env = {key: value for key, value in os.environ.items() if key not in ("UV_LOCKED", "UV_FROZEN", "VIRTUAL_ENV")}
    env.update(UV_PYTHON_DOWNLOADS="never", UV_PROJECT_ENVIRONMENT=str(cwd / ".venv"))
    return subprocess.run([UV, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    for name in ("pyproject.toml", "uv.lock", "README.md", "library/pyproject.toml"):  # the workspace and its member
        (tmp_path / name).parent.mkdir(exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_the_lock_names_this_projects_own_package():
    """A project made from the cookiecutter template gets a lock of its own package, not this one's."""
    [name] = re.findall(r'(?m)^name = "(.+)"$', (REPO / "pyproject.toml").read_text())  # tomllib: 3.11+
    entry = f'[[package]]\nname = "{name}"\nversion = "0.1.0"\nsource = {{ editable = "." }}'
    assert entry in (REPO / "uv.lock").read_text()


@pytest.mark.slow
def test_requirements_txt_is_uv_locks_export(project_copy):
    committed = (REPO / "requirements.txt").read_text()
    [command] = EXPORT.findall(committed)  # the command that wrote it, in its header
    result = uv(*command.split()[1:], cwd=project_copy)
    assert result.returncode == 0, result.stderr
    assert (project_copy / "requirements.txt").read_text() == committed, f"requirements.txt is stale: run `{command}`"
    assert "torch==2.14.1" in committed and "--hash=sha256:" in committed  # pinned, with hashes: pip checks them


@pytest.mark.slow
def test_the_lock_is_current_and_a_lock_behind_pyproject_is_refused_naming_the_fix(project_copy):
    current = uv("lock", "--check", cwd=project_copy)
    assert current.returncode == 0, f"uv.lock is out of date with pyproject.toml, run `uv lock`:\n{current.stderr}"
    pyproject = project_copy / "library" / "pyproject.toml"  # the library's new dependency: the workspace locks it
    pyproject.write_text(pyproject.read_text().replace('"rich>=12",', '"rich>=12", "tqdm>=4",', 1))
    stale = uv("lock", "--check", cwd=project_copy)
    assert stale.returncode != 0
    assert "needs to be updated" in stale.stderr and "run `uv lock`" in stale.stderr


def pyenv_python(minor: str) -> Path | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(root.glob(f"versions/{minor}.*/bin/python{minor}"), key=lambda path: path.parts[-3])
    return found[-1] if found else None


@pytest.mark.slow
@pytest.mark.skipif(pyenv_python("3.9") is None, reason="needs pyenv's Python 3.9, just below requires-python")
def test_a_python_below_requires_python_is_refused_before_anything_is_installed(project_copy):
    result = uv("sync", "--python", str(pyenv_python("3.9")), cwd=project_copy)
    assert result.returncode != 0
    assert "3.9" in result.stderr and "requires-python" in result.stderr and ">=3.10, <3.14" in result.stderr
    assert not (project_copy / ".venv").exists()


def test_the_readme_set_up_is_what_ci_runs():
    readme, ci = (REPO / "README.md").read_text(), (REPO / ".ci" / "run").read_text()
    assert "\nuv run python -m project fit --config configs/digits.yaml " in readme
    assert "\nuv run pytest\n" in readme
    assert "pip install --no-deps -e library -e . && pip install -r requirements.txt" in readme
    assert "\nuv sync " in ci and "\nuv run pytest " in ci
    assert "export UV_LOCKED=1 " in ci  # every uv command in CI installs from the lock as it is, or fails
