"""The GPU proof installs on the node it is written for: simulated here on CPU, with a fresh virtual environment that
holds only torch, Lightning, torchmetrics and scikit-learn (and what they need), then exactly
`scripts/gpu_check.sh --download` and its offline install."""

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from helpers import REPO, project_env

pytestmark = pytest.mark.slow  # every test here starts processes or trains for seconds

NODE_PACKAGES = ("torch", "lightning", "torchmetrics", "scikit-learn")
VENV_OWN = {"pip", "setuptools", "wheel"}  # a fresh venv has its own
ROOT_OUTPUTS = {".git", ".venv", "runs", "data", "wheels", "build", "dist"}  # .gitignore's, and git's own folder


def closure(names: tuple[str, ...]) -> set[str]:
    """NAMES and every distribution they require (extras aside), as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional or platform-specific requirement
        seen.add(name)
        todo += [req for req in dist.requires or [] if "extra ==" not in req]
    return seen


def link_packages(names: set[str], site_packages: Path) -> None:
    """Makes the distributions NAMES installed in SITE_PACKAGES by linking their files' top-level entries."""
    for name in names:
        dist = metadata.distribution(name)
        tops = {Path(str(file)).parts[0] for file in dist.files or []}
        for top in tops - {"..", "bin"}:
            source = Path(dist.locate_file(top))
            target = site_packages / top
            if source.exists() and not target.exists():
                target.symlink_to(source)


def not_source(folder: str, names: list[str]) -> set[str]:
    """What a copy of the repository leaves out (for shutil.copytree): outputs, caches and environments."""
    outputs = ROOT_OUTPUTS if Path(folder) == REPO else set()
    return {
        name
        for name in names
        if name in outputs or name in {"__pycache__", "lightning_logs"} or name.endswith((".egg-info", "_cache"))
    }


@pytest.mark.skipif(sys.platform != "linux", reason="the venv layout and symlinks of a Linux node")
def test_the_offline_gpu_node_install_gives_a_working_cli(tmp_path):
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", str(node)], check=True)
    [site_packages] = node.glob("lib/python*/site-packages")
    link_packages(closure(NODE_PACKAGES) - VENV_OWN, site_packages)
    checkout = tmp_path / "checkout"  # the install writes build files into the tree: a copy, not this repository
    shutil.copytree(REPO, checkout, ignore=not_source)  # a git checkout or a plain folder alike
    env = project_env(WHEELS=str(tmp_path / "wheels"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env["PATH"] = os.pathsep.join([str(node / "bin"), env["PATH"]])
    env.pop("VIRTUAL_ENV", None)
    for step in (["--download"], ["--install-only"]):
        done = subprocess.run(
            ["bash", "library/scripts/gpu_check.sh", *step], cwd=checkout, env=env, capture_output=True
        )
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    python = str(node / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "list"], env=env, capture_output=True, text=True).stdout
    assert re.search(r"^torch\s+2\.14\.1", installed, re.MULTILINE)  # the node's own torch, not replaced
    outside = {"cwd": tmp_path, "env": env, "capture_output": True, "text": True}  # the installed copy
    doctor = subprocess.run([python, "-m", "project", "doctor"], **outside)
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    assert "ok  correctness SIGTERM preemption and SLURM requeue" in doctor.stdout
    flags = ["--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path / "run")]
    fit = subprocess.run(
        [python, "-m", "project", "fit", "--config", str(checkout / "configs/digits.yaml"), *flags], **outside
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
