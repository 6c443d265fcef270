"""The cookiecutter flow, for real: template from the committed repository, render it with the real
cookiecutter as `my_vision_lab`, install it into a fresh virtual environment, run its tests and a fit."""

import importlib.util
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, last_checkpoint, project_env

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, like scripts/make_template.py
cookiecutter_main = pytest.importorskip("cookiecutter.main")
from cookiecutter.environment import StrictEnvironment  # noqa: E402
from cookiecutter.exceptions import FailedHookException  # noqa: E402

spec = importlib.util.spec_from_file_location("make_template", REPO / "scripts" / "make_template.py")
make_template = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_template)

NAME = make_template.package_name(REPO)
IS_GIT_CHECKOUT = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode == 0
CONTEXT = {
    "project_name": "My Vision Lab",
    "package_name": "my_vision_lab",
    "author": 'Ada "Countess" Lovelace',
    "description": "Vision experiments on many GPUs",
}
# The end-to-end tests need a commit to make the template from, and a name to rename the package from.
TEXT_OUTPUT = {"capture_output": True, "text": True}
end_to_end = pytest.mark.skipif(
    not IS_GIT_CHECKOUT or CONTEXT["package_name"] == NAME, reason="needs a git checkout of another package name"
)


def render(text: str, path: str = "", name: str = NAME, own_description: str = "", **context: str) -> str:
    """TEXT templated as package NAME (whose description is OWN_DESCRIPTION), rendered with CONTEXT's words."""
    template = make_template.template_text(text, name, path, own_description)
    environment = StrictEnvironment(keep_trailing_newline=True)  # as cookiecutter renders files
    return environment.from_string(template).render(cookiecutter={**CONTEXT, **context})


def test_only_package_references_change_and_jinja_looking_text_survives():
    source = (
        "from project.data import X; import project; from project import doctor\n"
        "class_path: project.networks.MLP  # see project/cli.py\n"
        'cmd = [sys.executable, "-m", "project"]; `python -m project fit`; `project fit ...`\n'
        'This project. The project\'s [project.scripts], config["project"], project_env(); my-project/x\n'
        'f"{{x}}" {% raw %} ${#array[@]} {# {% endraw %} {%- endraw %}\n'
    )
    assert render(source) == (
        "from my_vision_lab.data import X; import my_vision_lab; from my_vision_lab import doctor\n"
        "class_path: my_vision_lab.networks.MLP  # see my_vision_lab/cli.py\n"
        'cmd = [sys.executable, "-m", "my_vision_lab"]; `python -m my_vision_lab fit`; `my_vision_lab fit ...`\n'
        'This project. The project\'s [project.scripts], config["project"], project_env(); my-project/x\n'
        'f"{{x}}" {% raw %} ${#array[@]} {# {% endraw %} {%- endraw %}\n'
    )


def test_pyproject_takes_the_new_names_and_quotes_them_safely():
    rendered = tomllib.loads(render((REPO / "pyproject.toml").read_text(), "pyproject.toml"))
    assert rendered["project"]["name"] == "my_vision_lab"
    assert rendered["project"]["description"] == CONTEXT["description"]
    assert rendered["project"]["authors"] == [{"name": CONTEXT["author"]}]
    assert rendered["project"]["scripts"] == {"my_vision_lab": "my_vision_lab.__main__:main"}
    assert rendered["tool"]["setuptools"]["packages"]["find"]["include"] == ["my_vision_lab*"]


def test_a_rendered_project_templates_again_without_duplicate_lines():
    """A project made from the template can be a template itself: its own words are replaced, not added to."""
    other = {"project_name": "Other Lab", "package_name": "other_lab", "description": "Other", "author": "Grace"}
    readme, pyproject = (REPO / "README.md").read_text(), (REPO / "pyproject.toml").read_text()
    readme = render(readme, "README.md", own_description=make_template.description(REPO))
    assert readme.startswith(f"# My Vision Lab\n\n{CONTEXT['description']}\n\n")
    readme = render(readme, "README.md", "my_vision_lab", CONTEXT["description"], **other)
    assert readme.startswith("# Other Lab\n\nOther\n\n") and CONTEXT["description"] not in readme
    pyproject = render(render(pyproject, "pyproject.toml"), "pyproject.toml", "my_vision_lab", **other)
    config = tomllib.loads(pyproject)["project"]
    assert (config["name"], config["description"], config["authors"]) == ("other_lab", "Other", [{"name": "Grace"}])


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_template.make_template(REPO, tmp_path_factory.mktemp("template") / "lightning-template")


@pytest.fixture(scope="module")
def rendered(template, tmp_path_factory):
    output = tmp_path_factory.mktemp("rendered")
    path = cookiecutter_main.cookiecutter(str(template), no_input=True, extra_context=CONTEXT, output_dir=str(output))
    return output / "my-vision-lab", path


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
    # expose the base interpreter's instead, when this is itself a venv).
    (Path(own_site.stdout.strip()) / "parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = [str(python), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    result = subprocess.run([*install, "-e", str(project_dir)], timeout=300, **TEXT_OUTPUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return python


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


@end_to_end
def test_rendered_project_uses_the_new_names_everywhere(rendered):
    project_dir, path = rendered
    assert path == str(project_dir)
    assert (project_dir / "my_vision_lab" / "cli.py").is_file() and not (project_dir / NAME).exists()
    assert (project_dir / "README.md").read_text().startswith("# My Vision Lab\n\nVision experiments on many GPUs\n")
    assert (project_dir / ".ci" / "run").stat().st_mode & 0o111  # still executable
    modules = "|".join(p.stem for p in (REPO / NAME).glob("*.py") if p.stem != "__init__")
    # Package references that should be gone; ["project"] is pyproject's [project] table, not the package.
    leftovers = re.compile(
        rf"(?<![\w.\[-]){NAME}\.(?:{modules})\b|-m {NAME}\b|\b(?:import|from) {NAME}\b|(?<!\[)[\"'`]{NAME}[\"'`](?!\])"
    )
    files = [p for p in project_dir.rglob("*") if p.is_file()]
    assert len(files) > 20
    found = {str(p.relative_to(project_dir)): leftovers.findall(p.read_text()) for p in files}
    assert {path: hits for path, hits in found.items() if hits} == {}
    config = (project_dir / "configs" / "digits.yaml").read_text()
    assert "class_path: my_vision_lab.networks.MLP" in config and "my_vision_lab.data.DigitsDataModule" in config


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


@end_to_end
def test_rendered_project_installs_and_its_tests_and_lint_pass(rendered, venv_python):
    project_dir, _ = rendered
    located = subprocess.run(
        [str(venv_python), "-c", "import my_vision_lab.cli; print(my_vision_lab.cli.__file__)"],
        capture_output=True,
        text=True,
    )
    assert located.stdout.strip() == str(project_dir / "my_vision_lab" / "cli.py"), located.stderr
    # Fast unit tests, and this file: its rendering unit tests run there, its end-to-end ones skip (no git).
    tests = ["tests/test_networks.py", "tests/test_samplers.py", "tests/test_template.py", "tests/test_lock.py"]
    result = subprocess.run(
        [str(venv_python), "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider"],
        cwd=project_dir,
        env=project_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.search(r"\b\d+ passed, \d+ skipped in\b", result.stdout), result.stdout[-3000:]  # no failure, no error
    lint = subprocess.run(
        [str(venv_python), "-m", "ruff", "check", "."], cwd=project_dir, capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout[-3000:]  # its CI runs ruff too: renamed lines must still fit


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
