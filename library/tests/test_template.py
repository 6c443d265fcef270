"""The cookiecutter flow, for real: template from this repository, create `my_vision_lab` from it with cruft, lock it
(the library from a repository of it at its tag, by git URL), edit it as its owner would, bring the template's next
version in with `cruft update`, install it with uv, run its own suite as a user who is not root, and bring a newer
library in by its version alone."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import LIBRARY, REPO, last_checkpoint, project_env
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
LIBRARY_VERSION = tomllib.loads((LIBRARY / "pyproject.toml").read_text())["project"]["version"]
IS_GIT_CHECKOUT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode == 0
CONTEXT = {
    "project_name": "My Vision Lab: Zürich & Co.",  # an unusual name: its folder, title and commit carry it
    "package_name": "my_vision_lab",
    "author": 'Ada "Countess" Lovelace',
    "description": "Vision experiments on many GPUs",
    "library_repository": "https://example.com/lightning-template.git",
}
# The end-to-end tests need git to list the files to make the template from, and a name to rename the package from.
TEXT_OUTPUT = {"capture_output": True, "text": True}
end_to_end = pytest.mark.skipif(
    not IS_GIT_CHECKOUT or CONTEXT["package_name"] == NAME, reason="needs a git checkout of another package name"
)


def render(text: str, path: str = "", name: str = NAME, own_description: str = "", **context: str) -> str:
    """TEXT templated as package NAME (whose description is OWN_DESCRIPTION), rendered with CONTEXT's words."""
    template = make_template.template_text(text, name, path, own_description, LIBRARY_VERSION)
    environment = StrictEnvironment(keep_trailing_newline=True)  # as cookiecutter renders files
    return environment.from_string(template).render(
        cookiecutter={"project_slug": "my-vision-lab-zurich-co", **CONTEXT, **context}
    )


def test_only_package_references_change_and_jinja_looking_text_survives():
    source = (
        "from project.data import X; import project; from project import doctor\n"
        "class_path: project.networks.MLP  # see project/cli.py\n"
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
        "--job-name=my_vision_lab-sweep /tmp/my-vision-lab-zurich-co-slurm\n"
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
    url = f"git+{CONTEXT['library_repository']}@trainfleet-v{LIBRARY_VERSION}#subdirectory=library"
    assert rendered["project"]["dependencies"] == [f"trainfleet @ {url}"]
    assert rendered["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]
    assert "workspace" not in rendered["tool"]["uv"] and "sources" not in rendered["tool"]["uv"]


def test_a_rendered_project_templates_again_without_duplicate_lines():
    """A project made from the template can be a template itself: its own words are replaced, not added to."""
    other = {"project_name": "Other Lab", "package_name": "other_lab", "description": "Other", "author": "Grace"}
    readme, pyproject = (REPO / "README.md").read_text(), (REPO / "pyproject.toml").read_text()
    readme = render(readme, "README.md", own_description=make_template.description(PYPROJECT))
    assert readme.startswith(f"# {CONTEXT['project_name']}\n\n{CONTEXT['description']}\n\n")
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


def render_without_git_identity(template: Path, output: Path, home: Path, context: dict[str, str]) -> Path:
    """The project, rendered by plain cookiecutter where git has no identity: the hook locks it (uv's cache kept) and
    commits it as the template's author."""
    cache = subprocess.run([UV, "cache", "dir"], **TEXT_OUTPUT).stdout.strip()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"HOME": str(home), "XDG_CONFIG_HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}.items():
            patch.setenv(name, value)
        patch.setenv("UV_CACHE_DIR", cache)
        patch.setenv("PATH", os.pathsep.join([str(Path(UV).parent), os.environ.get("PATH", "")]))  # the hook's uv
        patch.delenv("GIT_CONFIG_GLOBAL", raising=False)
        context = {**CONTEXT, **context}
        return Path(
            cookiecutter_main.cookiecutter(str(template), no_input=True, extra_context=context, output_dir=str(output))
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
def library_repository(tmp_path_factory) -> Path:
    """The library as a project fetches it: a git repository with the library under library/, tagged with its version,
    made from the files on disk (as the template is)."""
    repository = tmp_path_factory.mktemp("library-repository")
    for path, (content, mode) in make_template.working_tree_files(REPO).items():
        if path.startswith("library/"):
            (repository / path).parent.mkdir(parents=True, exist_ok=True)
            (repository / path).write_bytes(content)
            (repository / path).chmod(mode)
    for step in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-qm", "The library"],
        ["tag", library_tag(LIBRARY_VERSION)],
    ):
        git(repository, *step)
    return repository


def library_tag(version: str) -> str:
    return f"trainfleet-v{version}"


@pytest.fixture(scope="module")
def shared_folder():
    """A folder a user other than root may read (pytest's own are root's alone): the project goes there."""
    folder = Path(tempfile.mkdtemp(prefix="rendered-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def uv(project_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """uv in PROJECT_DIR, as its owner runs it (its own .venv, never this suite's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_LOCKED", "UV_FROZEN")}
    env.update(UV_PYTHON=user_python(), UV_PYTHON_DOWNLOADS="never")
    done = subprocess.run([UV, *args], cwd=project_dir, env=env, timeout=600, **TEXT_OUTPUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def rendered(template_repository, library_repository, shared_folder):
    """The project as its owner has it: created by cruft, locked (the library from its repository's tag) and committed
    (docs/development.md), module.py edited and a file added and committed, then brought to the template's next
    version by `cruft update`, left to review; installed by `uv sync`."""
    context = {**CONTEXT, "library_repository": library_repository.as_uri()}
    path = cruft.create(str(template_repository), output_dir=shared_folder, extra_context=context, no_input=True)
    project_dir = shared_folder / "my-vision-lab-zurich-co"
    uv(project_dir, "lock", "--quiet")
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
    uv(project_dir, "sync", "--quiet")
    return project_dir, str(path)


BIN = Path(sys.executable).parent  # this environment's: the dev extra's uv is there
UV = shutil.which("uv", path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")])) or "uv"


def user_python() -> str:
    """An interpreter the project's user can run: this one's base, unless it lies where only root may read (pyenv's
    under /root), then the system's."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if os.geteuid() != 0 or not str(base.resolve()).startswith("/root/"):
        return str(base)
    return shutil.which("python3", path="/usr/local/bin:/usr/bin") or str(base)


def as_user(command: list[str], home: Path) -> list[str]:
    """COMMAND run as a user who is not root (nobody) when this suite runs as root: what a user of the project is."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "nobody", "--", "env", f"HOME={home}", *command]


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
    assert (tmp_path / folder / package / "__main__.py").is_file()
    assert (tmp_path / folder / "README.md").read_text().startswith(f"# {project_name}\n")


@pytest.mark.slow
@end_to_end
def test_rendered_project_uses_the_new_names_everywhere(rendered):
    project_dir, path = rendered
    assert path == str(project_dir)
    assert (project_dir / "my_vision_lab" / "module.py").is_file() and not (project_dir / NAME).exists()
    title = f"# {CONTEXT['project_name']}\n\n{CONTEXT['description']}\n"
    assert (project_dir / "README.md").read_text().startswith(title)
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
    assert len(files) > 30
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
def test_the_rendered_project_is_thin_carries_no_history_and_names_only_paths_it_has(rendered):
    """What the owner gets is theirs: their code, configs, launch scripts and tests; nothing of the library, the
    template's tooling or its dated reports; at most 60 files and 800 lines of Python outside the tests."""
    project_dir, _ = rendered
    files = git(project_dir, "ls-files").split()
    assert not [path for path in files if path.startswith(("library/", "docs/")) or "make_template" in path]
    python = [project_dir / path for path in files if path.endswith(".py") and not path.startswith("tests/")]
    lines = sum(len(path.read_text().splitlines()) for path in python)
    assert len(files) <= 60 and lines <= 800, (len(files), lines)
    assert missing_paths(project_dir) == {}
    dated = re.findall(r"\b20\d\d-\d\d-\d\d\b", (project_dir / "README.md").read_text())
    assert dated == [] and "uv.lock" in files


@pytest.mark.slow
@end_to_end
def test_the_rendered_project_is_a_locked_git_repository_with_everything_in_one_commit(
    template, library_repository, tmp_path_factory
):
    context = {"library_repository": library_repository.as_uri()}
    output, home = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("home")
    project_dir = render_without_git_identity(template, output, home, context)
    git = {"cwd": project_dir, **TEXT_OUTPUT}
    log = subprocess.run(["git", "log", "--format=%an <%ae> %s"], **git).stdout.splitlines()
    assert log == [f"{CONTEXT['author']} <> New project from the Lightning template: {CONTEXT['project_name']}"]
    assert subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], **git).stdout == ""
    committed = subprocess.run(["git", "ls-files"], **git).stdout.split()
    assert "my_vision_lab/module.py" in committed and "tests/test_classes.py" in committed
    lock = (project_dir / "uv.lock").read_text()  # the hook locked it: the library pinned at its tag's commit
    commit = subprocess.run(["git", "rev-parse", library_tag(LIBRARY_VERSION)], cwd=library_repository, **TEXT_OUTPUT)
    assert f"trainfleet-v{LIBRARY_VERSION}#{commit.stdout.strip()}" in lock and "uv.lock" in committed


@pytest.mark.slow
@end_to_end
def test_its_own_suite_and_lint_pass_as_a_user_who_is_not_root(rendered, tmp_path_factory):
    """The README's test command in the project, by a user of it: the library's checks on its classes, a real
    two-process fit. Its time, alone on the machine, is in the note (here it shares the cores with the suite)."""
    project_dir, _ = rendered
    home = tempfile.mkdtemp(prefix="home-")
    os.chmod(home, 0o777)
    command = [str(project_dir / ".venv" / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q"]
    started = time.monotonic()
    suite = subprocess.run(as_user(command, Path(home)), cwd=project_dir, env=project_env(), **TEXT_OUTPUT)
    took = time.monotonic() - started
    shutil.rmtree(home, ignore_errors=True)
    assert suite.returncode == 0, suite.stdout[-5000:]
    passed = int(re.search(r"(\d+) passed", suite.stdout)[1])
    assert passed >= 25 and " failed" not in suite.stdout and "test_training.py" in suite.stdout, (passed, took)
    lint = subprocess.run([str(project_dir / ".venv" / "bin" / "ruff"), "check", "."], cwd=project_dir, **TEXT_OUTPUT)
    assert lint.returncode == 0, lint.stdout[-3000:]  # its CI runs ruff too: renamed lines must still fit


@pytest.mark.slow
@end_to_end
def test_rendered_projects_console_command_fits(rendered, tmp_path):
    """The console command the install made (`my_vision_lab fit ...`): one fresh start-up checks both."""
    project_dir, _ = rendered
    run_dir = tmp_path / "run"
    fit = [str(project_dir / ".venv" / "bin" / "my_vision_lab"), "fit", "--config", "configs/digits.yaml"]
    flags = ["--trainer.max_epochs", "1", "--trainer.default_root_dir", str(run_dir)]
    flags += ["--trainer.enable_progress_bar", "false", "--trainer.num_sanity_val_steps", "0"]
    result = subprocess.run([*fit, *flags], cwd=project_dir, env=project_env(), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert last_checkpoint(run_dir).is_file() and "[my_vision_lab] fit ended" in result.stderr
    saved_config = (run_dir / "lightning_logs" / "version_0" / "config.yaml").read_text()
    assert "class_path: my_vision_lab.networks.MLP" in saved_config


NEW_HELP = "the distributed setup, as the next library version words it"


@pytest.mark.slow
@end_to_end
def test_a_newer_library_arrives_by_its_version_alone(rendered, library_repository):
    """A fix of the library (here a changed message) reaches the project as a new tag: the project's pyproject.toml
    names it, `uv lock --upgrade-package trainfleet` and `uv sync` bring it; nothing of the project is merged.
    Runs after the tests above, which see the first version (one worker takes the whole file, in order)."""
    project_dir, _ = rendered
    main = library_repository / "library" / "trainfleet" / "main.py"
    old_help = "the distributed setup; launched like training, all-reduce checked and timed on every rank"
    main.write_text(main.read_text().replace(old_help, NEW_HELP))
    library_pyproject = library_repository / "library" / "pyproject.toml"
    newer = LIBRARY_VERSION + ".1"
    library_pyproject.write_text(
        library_pyproject.read_text().replace(f'version = "{LIBRARY_VERSION}"', f'version = "{newer}"')
    )
    git(library_repository, "commit", "-qam", "A clearer message")
    git(library_repository, "tag", library_tag(newer))
    before = set(git(project_dir, "status", "--porcelain").splitlines())
    pyproject = project_dir / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(library_tag(LIBRARY_VERSION), library_tag(newer)))
    uv(project_dir, "lock", "--upgrade-package", "trainfleet", "--quiet")
    uv(project_dir, "sync", "--quiet")
    changed = set(git(project_dir, "status", "--porcelain").splitlines()) - before
    assert changed == {" M pyproject.toml", " M uv.lock"}
    python = str(project_dir / ".venv" / "bin" / "python")
    helped = subprocess.run(
        [python, "-m", "my_vision_lab", "--help"], cwd=project_dir, env=project_env(), **TEXT_OUTPUT
    )
    assert NEW_HELP in " ".join(helped.stdout.split()), helped.stdout[-2000:]
    version = subprocess.run(
        [python, "-c", "from importlib.metadata import version; print(version('trainfleet'))"], **TEXT_OUTPUT
    )
    assert version.stdout.strip() == newer
