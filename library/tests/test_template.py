"""The cookiecutter flow, for real: template from this repository, create `my_vision_lab` from it with cruft, edit it as
its owner would, bring the template's next version in with `cruft update`, install it into a virtual environment that
reuses this one's packages, run its own tests that name the package (a multi-process fit among them) and a fit with
its console command."""

import ast
import importlib.util
import json
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, last_checkpoint, project_env
from helpers.named_paths import missing_paths

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, like scripts/make_template.py
cookiecutter_main = pytest.importorskip("cookiecutter.main")
cruft = pytest.importorskip("cruft")
from cookiecutter.environment import StrictEnvironment  # noqa: E402
from cookiecutter.exceptions import FailedHookException  # noqa: E402

spec = importlib.util.spec_from_file_location("make_template", REPO / "scripts" / "make_template.py")
make_template = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_template)

PYPROJECT = make_template.read_pyproject(REPO)
NAME = make_template.package_name(PYPROJECT)
IS_GIT_CHECKOUT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode == 0
CONTEXT = {
    "project_name": "My Vision Lab",
    "package_name": "my_vision_lab",
    "author": 'Ada "Countess" Lovelace',
    "description": "Vision experiments on many GPUs",
}
# The end-to-end tests need git to list the files to make the template from, and a name to rename the package from.
TEXT_OUTPUT = {"capture_output": True, "text": True}
end_to_end = pytest.mark.skipif(
    not IS_GIT_CHECKOUT or CONTEXT["package_name"] == NAME, reason="needs a git checkout of another package name"
)


def render(text: str, path: str = "", name: str = NAME, own_description: str = "", **context: str) -> str:
    """TEXT templated as package NAME (whose description is OWN_DESCRIPTION), rendered with CONTEXT's words."""
    template = make_template.template_text(text, name, path, own_description)
    environment = StrictEnvironment(keep_trailing_newline=True)  # as cookiecutter renders files
    return environment.from_string(template).render(
        cookiecutter={"project_slug": "my-vision-lab", **CONTEXT, **context}
    )


def test_only_package_references_change_and_jinja_looking_text_survives():
    source = (
        "from trainfleet.data import X; import project; from project import doctor\n"
        "class_path: project.networks.MLP  # see trainfleet/cli.py\n"
        'cmd = [sys.executable, "-m", "project"]; `python -m project fit`; `project fit ...`\n'
        'This project. The project\'s [project.scripts], config["project"], project_env(); my-project/x\n'
        'f"{{x}}" {% raw %} ${#array[@]} {# {% endraw %} {%- endraw %}\n'
        'f"{project.__name__}." [project] resuming; r"\\[project\\] rank"; '
        "--job-name=project-sweep /tmp/project-slurm\n"
        'sys.argv = ["project"]; "usage: project [-c CONFIG]"; ["/usr/local/bin/project"]; '
        '"project fit --x"\n'
    )
    assert render(source) == (
        "from my_vision_lab.data import X; import my_vision_lab; from my_vision_lab import doctor\n"
        "class_path: my_vision_lab.networks.MLP  # see my_vision_lab/cli.py\n"
        'cmd = [sys.executable, "-m", "my_vision_lab"]; `python -m my_vision_lab fit`; `my_vision_lab fit ...`\n'
        'This project. The project\'s [project.scripts], config["project"], project_env(); my-project/x\n'
        'f"{{x}}" {% raw %} ${#array[@]} {# {% endraw %} {%- endraw %}\n'
        'f"{my_vision_lab.__name__}." [my_vision_lab] resuming; r"\\[my_vision_lab\\] rank"; '
        "--job-name=my_vision_lab-sweep /tmp/my-vision-lab-slurm\n"
        'sys.argv = ["my_vision_lab"]; "usage: my_vision_lab [-c CONFIG]"; ["/usr/local/bin/my_vision_lab"]; '
        '"my_vision_lab fit --x"\n'
    )


def test_pyproject_takes_the_new_names_and_quotes_them_safely():
    rendered = tomllib.loads(render((REPO / "pyproject.toml").read_text(), "pyproject.toml"))
    assert rendered["project"]["name"] == "my_vision_lab"
    assert rendered["project"]["description"] == CONTEXT["description"]
    assert rendered["project"]["authors"] == [{"name": CONTEXT["author"]}]
    assert rendered["project"]["scripts"] == {"my_vision_lab": "my_vision_lab.__main__:run"}
    assert rendered["tool"]["setuptools"]["packages"]["find"]["include"] == ["my_vision_lab*"]


def test_a_rendered_project_templates_again_without_duplicate_lines():
    """A project made from the template can be a template itself: its own words are replaced, not added to."""
    other = {"project_name": "Other Lab", "package_name": "other_lab", "description": "Other", "author": "Grace"}
    readme, pyproject = (REPO / "README.md").read_text(), (REPO / "pyproject.toml").read_text()
    readme = render(readme, "README.md", own_description=make_template.description(PYPROJECT))
    assert readme.startswith(f"# My Vision Lab\n\n{CONTEXT['description']}\n\n")
    readme = render(readme, "README.md", "my_vision_lab", CONTEXT["description"], **other)
    assert readme.startswith("# Other Lab\n\nOther\n\n") and CONTEXT["description"] not in readme
    pyproject = render(render(pyproject, "pyproject.toml"), "pyproject.toml", "my_vision_lab", **other)
    config = tomllib.loads(pyproject)["project"]
    assert (config["name"], config["description"], config["authors"]) == ("other_lab", "Other", [{"name": "Grace"}])


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The template of the files on disk: in CI the last commit, on a working copy the change under test too."""
    return make_template.make_template(REPO, tmp_path_factory.mktemp("template") / "lightning-template", worktree=True)


def git(cwd: Path, *args: str) -> str:
    """git in CWD, as a user with an identity of their own."""
    identity = ["-c", "user.name=Owner", "-c", "user.email=owner@example.com"]
    return subprocess.run(["git", *identity, *args], cwd=cwd, check=True, **TEXT_OUTPUT).stdout


def render_without_git_identity(template: Path, output: Path, home: Path) -> Path:
    """The project, rendered by plain cookiecutter where git has no identity: the hook commits as the template's
    author."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"HOME": str(home), "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}.items():
            patch.setenv(name, value)
        patch.delenv("GIT_CONFIG_GLOBAL", raising=False)
        return Path(
            cookiecutter_main.cookiecutter(str(template), no_input=True, extra_context=CONTEXT, output_dir=str(output))
        )


TEMPLATE_FIX = "# A fix of the template's, made after the project was created.\n"
OWNERS_EDIT = "\n\n# The owner's own line.\n"
OWNERS_FILE = ("notes/ideas.md", "The owner's file.\n")


@pytest.fixture(scope="module")
def template_repository(template, tmp_path_factory):
    """A clone of the template that gets a later version (one commit), for the project made from it to update to."""
    clone = tmp_path_factory.mktemp("template-repository") / "lightning-template"
    subprocess.run(["git", "clone", "-q", str(template), str(clone)], check=True)
    return clone


@pytest.fixture(scope="module")
def rendered(template_repository, tmp_path_factory):
    """The project as its owner has it: created by cruft and committed (docs/development.md), module.py edited and a
    file added and committed, then brought to the template's next version by `cruft update`, left to review."""
    output = tmp_path_factory.mktemp("rendered")
    path = cruft.create(str(template_repository), output_dir=output, extra_context=CONTEXT, no_input=True)
    project_dir = output / "my-vision-lab"
    git(project_dir, "init", "-q")
    git(project_dir, "add", "-A")
    git(project_dir, "commit", "-qm", "New project")
    with (project_dir / "my_vision_lab" / "module.py").open("a") as module:
        module.write(OWNERS_EDIT)
    (project_dir / OWNERS_FILE[0]).parent.mkdir()
    (project_dir / OWNERS_FILE[0]).write_text(OWNERS_FILE[1])
    git(project_dir, "add", "-A")
    git(project_dir, "commit", "-qm", "The owner's edits")
    template_module = template_repository / make_template.PROJECT_DIR / "{{cookiecutter.package_name}}" / "module.py"
    template_module.write_text(TEMPLATE_FIX + template_module.read_text())
    git(template_repository, "commit", "-qam", "A fix")
    assert cruft.update(project_dir, skip_apply_ask=True)
    return project_dir, str(path)


@pytest.fixture(scope="module")
def venv_python(rendered, tmp_path_factory):
    """A fresh venv that sees this environment's packages (torch, Lightning: no network), with the new project
    installed editable by this environment's pip and setuptools, never the base interpreter's."""
    project_dir, _ = rendered
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], **TEXT_OUTPUT)
    # A .pth file puts this environment's site-packages on the new one's path (`--system-site-packages` would
    # expose the base interpreter's instead, when this is itself a venv: pitfall 18).
    (Path(own_site.stdout.strip()) / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    result = subprocess.run([*install, "-e", str(project_dir)], timeout=300, **TEXT_OUTPUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return python


def small_repository(path: Path) -> Path:
    """A repository of make_template.py, pyproject.toml and a package of one committed file."""
    (path / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "make_template.py", path / "scripts")
    shutil.copy(REPO / "pyproject.toml", path)
    (path / NAME).mkdir()
    (path / NAME / "__init__.py").write_text('"""committed"""\n')
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the first commit"]):
        git(path, *step)
    return path


@pytest.mark.slow
def test_each_template_version_is_one_commit_of_the_template_repository(tmp_path):
    """What cruft needs: a git repository whose commits are the versions; a file the new version lacks is deleted."""
    repo, template = small_repository(tmp_path / "repo"), tmp_path / "template"
    make = [sys.executable, "scripts/make_template.py", str(template)]
    assert subprocess.run(make, cwd=repo, **TEXT_OUTPUT).returncode == 0
    (repo / NAME / "extra.py").write_text('"""added"""\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the second commit")
    for _ in range(2):  # the second time, nothing has changed: no commit
        made = subprocess.run(make, cwd=repo, **TEXT_OUTPUT)
        assert made.returncode == 0 and f"cruft create {template}" in made.stdout, made.stderr
    sources = git(repo, "log", "--format=%h").split()
    assert git(template, "log", "--format=%s").splitlines() == [f"Template of {sha}" for sha in sources]
    package = template / make_template.PROJECT_DIR / "{{cookiecutter.package_name}}"
    git(repo, "rm", "-q", f"{NAME}/extra.py")
    git(repo, "commit", "-qm", "the third commit")
    assert subprocess.run(make, cwd=repo, **TEXT_OUTPUT).returncode == 0
    assert not (package / "extra.py").exists() and (package / "__init__.py").is_file()
    assert git(template, "status", "--porcelain") == ""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file").write_text("not a template\n")
    refused = subprocess.run([*make[:2], str(tmp_path / "other")], cwd=repo, **TEXT_OUTPUT)
    assert refused.returncode == 2 and "neither empty nor a template this script wrote" in refused.stderr


@pytest.mark.slow
def test_a_template_of_the_last_commit_is_refused_while_changes_are_uncommitted(tmp_path):
    """Uncommitted edits would be silently left out: refused (exit 2, naming them); --worktree takes them."""
    repo = small_repository(tmp_path / "repo")
    (repo / NAME / "__init__.py").write_text('"""not committed"""\n')
    (repo / "notes.md").write_text("a new file\n")
    make = [sys.executable, "scripts/make_template.py"]
    refused = subprocess.run([*make, str(tmp_path / "refused")], cwd=repo, **TEXT_OUTPUT)
    assert refused.returncode == 2
    assert (
        f"uncommitted changes, which a template of its last commit would leave out (M {NAME}/__init__.py, ?? notes.md)"
        in refused.stderr
        and "--worktree" in refused.stderr
    )
    assert not (tmp_path / "refused").exists()
    made = subprocess.run([*make, str(tmp_path / "made"), "--worktree"], cwd=repo, **TEXT_OUTPUT)
    assert made.returncode == 0, made.stderr
    assert "template of the working tree, uncommitted changes included" in made.stdout
    project = tmp_path / "made" / make_template.PROJECT_DIR
    assert (project / "{{cookiecutter.package_name}}" / "__init__.py").read_text() == '"""not committed"""\n'
    assert (project / "notes.md").read_text() == "a new file\n"


@pytest.mark.slow
@end_to_end
@pytest.mark.parametrize(
    ("project_name", "folder", "package"),
    [
        ("Zürich Lab: Vision & Co", "zurich-lab-vision-co", "zurich_lab_vision_co"),
        (" Ça va? Déjà-vu!! 2 ", "ca-va-deja-vu-2", "ca_va_deja_vu_2"),
    ],
)
def test_the_project_folder_is_a_clean_slug_of_any_project_name(template, tmp_path, project_name, folder, package):
    path = cookiecutter_main.cookiecutter(
        str(template), no_input=True, extra_context={"project_name": project_name}, output_dir=str(tmp_path)
    )
    assert Path(path) == tmp_path / folder
    assert (tmp_path / folder / package / "cli.py").is_file()
    assert (tmp_path / folder / "README.md").read_text().startswith(f"# {project_name}\n")


@pytest.mark.slow
@end_to_end
def test_rendered_project_uses_the_new_names_everywhere(rendered):
    project_dir, path = rendered
    assert path == str(project_dir)
    assert (project_dir / "my_vision_lab" / "cli.py").is_file() and not (project_dir / NAME).exists()
    assert (project_dir / "README.md").read_text().startswith("# My Vision Lab\n\nVision experiments on many GPUs\n")
    assert (project_dir / ".ci" / "run").stat().st_mode & 0o111  # still executable
    modules = "|".join(p.stem for p in (REPO / NAME).glob("*.py") if p.stem != "__init__")
    # Package references that should be gone; config["project"] is pyproject's [project] table, not the package.
    leftovers = re.compile(
        rf"(?<![\w.\[-]){NAME}\.(?:{modules})\b|-m {NAME}\b|\b(?:import|from) {NAME}\b"
        rf"|(?<![\w)\]]\[)[\"'`]{NAME}[\"'`.]"
        rf"|\[{NAME}\\?\] |={NAME}\b|\b{NAME}-\w|usage: {NAME}\b|/{NAME}\b(?!\.toml)"  # logs, job names, prog names
    )
    files = [
        project_dir / name
        for name in subprocess.run(["git", "ls-files"], cwd=project_dir, **TEXT_OUTPUT).stdout.split()
    ]
    assert len(files) > 100
    found = {str(p.relative_to(project_dir)): leftovers.findall(p.read_text()) for p in files}
    assert {path: hits for path, hits in found.items() if hits} == {}
    config = (project_dir / "configs" / "digits.yaml").read_text()
    assert "class_path: my_vision_lab.networks.MLP" in config and "my_vision_lab.data.DigitsDataModule" in config


@pytest.mark.slow
@end_to_end
@pytest.mark.parametrize(
    "context",
    [
        {"package_name": "my-lab"},
        {"package_name": "2nd_lab"},
        {"package_name": "class"},
        {"package_name": "zürich_lab"},
        {"package_name": "my lab"},
    ],
    ids=["dash", "digit-first", "keyword", "non-ascii", "space"],
)
def test_an_unusable_name_stops_cookiecutter_before_writing(template, tmp_path, context):
    with pytest.raises(FailedHookException):
        cookiecutter_main.cookiecutter(str(template), no_input=True, extra_context=context, output_dir=str(tmp_path))
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
@end_to_end
def test_cruft_update_brings_the_templates_next_version_and_keeps_the_owners_edits(rendered, template_repository):
    """The fix arrives in the file the owner edited, their line and file stay, and the project records the version."""
    project_dir, _ = rendered
    module = (project_dir / "my_vision_lab" / "module.py").read_text()
    assert module.startswith(TEMPLATE_FIX) and module.endswith(OWNERS_EDIT)
    assert (project_dir / OWNERS_FILE[0]).read_text() == OWNERS_FILE[1]
    record = json.loads((project_dir / ".cruft.json").read_text())
    latest = git(template_repository, "rev-parse", "HEAD").strip()
    assert (record["template"], record["commit"]) == (str(template_repository), latest)
    assert record["context"]["cookiecutter"]["package_name"] == "my_vision_lab"
    # The update waits for the owner's review and commit, as changes of the working tree.
    assert git(project_dir, "status", "--porcelain").splitlines() == [" M .cruft.json", "M  my_vision_lab/module.py"]
    assert cruft.check(project_dir)  # `cruft check`: the project is at the template's latest version


@pytest.mark.slow
@end_to_end
def test_the_rendered_project_carries_no_history_and_names_only_paths_it_has(rendered):
    """The template's dated reports stay in the template; the links to them read as words; no dated pages."""
    project_dir, _ = rendered
    assert not (project_dir / "docs" / "reports").exists()
    assert missing_paths(project_dir) == {}
    pages = [project_dir / "README.md", *(project_dir / "docs").glob("*.md")]
    dated = {page.name: re.findall(r"\b20\d\d-\d\d-\d\d\b", page.read_text()) for page in pages}
    assert {page: dates for page, dates in dated.items() if dates} == {}
    assert "the template's reports" in (project_dir / "docs" / "fault-tolerance.md").read_text()


@pytest.mark.slow
@end_to_end
def test_the_rendered_project_is_a_git_repository_with_everything_in_one_commit(template, tmp_path_factory):
    project_dir = render_without_git_identity(template, tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("home"))
    git = {"cwd": project_dir, **TEXT_OUTPUT}
    log = subprocess.run(["git", "log", "--format=%an <%ae> %s"], **git).stdout.splitlines()
    assert log == [f"{CONTEXT['author']} <> New project from the Lightning template: My Vision Lab"]
    assert subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], **git).stdout == ""
    committed = subprocess.run(["git", "ls-files"], **git).stdout.split()
    assert "my_vision_lab/cli.py" in committed and "tests/test_template.py" in committed and len(committed) > 100


# The rendered project's tests that name its package are run again there: every fast one, and of the slow ones (each
# starts processes or parses configs; this suite runs them all here) one for each way they name it: `-m my_vision_lab`
# command lines (the two-process fit), the `[my_vision_lab]` prefix of its messages (the second Ctrl-C) and class
# paths in configs (the GPU and MNIST overlays). Its whole suite, by hand: docs/development.md. Tests marked slurm
# never run there: they need the local cluster.
MULTI_PROCESS_FIT = "tests/test_end_to_end.py::test_ddp_fit_writes_last_checkpoint_after_every_epoch"
RERUN_SLOW = {
    MULTI_PROCESS_FIT,
    "tests/test_faults.py::test_a_second_ctrl_c_stops_every_process_at_once_without_saving",
    "tests/test_configs.py::test_gpu_overlay_selects_nccl_ddp_on_all_gpus",
    "tests/test_mnist.py::test_config_overlay_parses_without_torchvision",
}


def package_naming_tests(project_dir: Path, package: str) -> dict[str, bool]:
    """The tests of PROJECT_DIR whose own code names PACKAGE, as pytest node ids, each with whether it is slow."""
    found = {}
    for path in sorted((project_dir / "tests").glob("test_*.py")):
        source = path.read_text()
        slow_file = "pytestmark = pytest.mark.slow" in source
        for node in ast.parse(source).body:
            named = isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            if named and package in ast.get_source_segment(source, node):
                decorators = [ast.get_source_segment(source, decorator) for decorator in node.decorator_list]
                found[f"tests/{path.name}::{node.name}"] = slow_file or "pytest.mark.slow" in decorators
    return found


@pytest.mark.slow
@end_to_end
def test_rendered_project_installs_and_its_own_tests_that_name_it_and_lint_pass(rendered, venv_python):
    project_dir, _ = rendered
    located = subprocess.run(
        [str(venv_python), "-c", "import my_vision_lab.cli; print(my_vision_lab.cli.__file__)"], **TEXT_OUTPUT
    )
    assert located.stdout.strip() == str(project_dir / "my_vision_lab" / "cli.py"), located.stderr
    naming = package_naming_tests(project_dir, "my_vision_lab")
    assert all(naming.get(test) for test in RERUN_SLOW)  # the names above are still slow tests' names
    # And test_lock.py: its lock names the package it reads from pyproject.toml.
    selected = [test for test, slow in naming.items() if not slow or test in RERUN_SLOW] + ["tests/test_lock.py"]
    # One process: this test already shares the 2 cores with the suite's other worker.
    command = [
        str(venv_python),
        "-m",
        "pytest",
        *selected,
        "-n",
        "0",
        "-m",
        "not slurm",
        "-rA",
        "-p",
        "no:cacheprovider",
    ]
    result = subprocess.run(command, cwd=project_dir, env=project_env(), timeout=600, **TEXT_OUTPUT)
    assert result.returncode == 0, result.stdout[-5000:]
    passed = {line.split("[")[0] for line in re.findall(r"^PASSED (\S+)", result.stdout, re.MULTILINE)}
    # The rest: the SLURM sweep (deselected) and test_template.py's end-to-end tests, which skip in a project
    # already named my_vision_lab (they would render it again); test_lock.py, named as a file (its exit code).
    not_passed = {test for test in selected if test not in passed}
    assert all(re.search("test_(slurm|template|lock).py", test) for test in not_passed), not_passed
    assert MULTI_PROCESS_FIT in passed and "tests/test_boundary.py" in " ".join(passed) and len(passed) >= 15
    lint = subprocess.run([str(venv_python), "-m", "ruff", "check", "."], cwd=project_dir, **TEXT_OUTPUT)
    assert lint.returncode == 0, lint.stdout[-3000:]  # its CI runs ruff too: renamed lines must still fit


@pytest.mark.slow
@end_to_end
def test_rendered_projects_console_command_fits(rendered, venv_python, tmp_path):
    """The console command the install made (`my_vision_lab fit ...`): one fresh start-up checks both."""
    project_dir, _ = rendered
    run_dir = tmp_path / "run"
    fit = [str(venv_python.parent / "my_vision_lab"), "fit", "--config", "configs/digits.yaml"]
    flags = ["--trainer.max_epochs", "1", "--trainer.default_root_dir", str(run_dir)]
    flags += ["--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0"]
    result = subprocess.run([*fit, *flags], cwd=project_dir, env=project_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_checkpoint(run_dir).is_file()
    saved_config = (run_dir / "lightning_logs" / "version_0" / "config.yaml").read_text()
    assert "class_path: my_vision_lab.networks.MLP" in saved_config
