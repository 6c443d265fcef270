"""Writes a cookiecutter template of this repository: every committed file, with the package's name as a variable.

    python scripts/make_template.py /tmp/lightning-template
    cookiecutter /tmp/lightning-template          # asks for project_name, package_name, author, description

The repository stays the one source of truth: the template is generated, never edited.
Only real references to the package are replaced (see REFERENCE_PATTERNS), not the English
word; any text that Jinja would read (``{{``, ``{%``, ``{#``) is wrapped in raw blocks,
so it reaches the new project unchanged. Needs Python 3.11+ (tomllib).
"""

import argparse
import io
import json
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import tomllib  # Python 3.11+: this is a maintainer's tool, the package itself runs on 3.10

PACKAGE_VAR = "{{ cookiecutter.package_name }}"
PROJECT_DIR = "{{cookiecutter.project_slug}}"
JINJA_OPENERS = ("{{", "{%", "{#")
ENDRAW = re.compile(r"(\{%[-+]?\s*endraw\s*[-+]?%\})")  # every spelling Jinja ends a raw block with

# Each pattern finds one kind of reference to the package NAME (substituted for {name}).
REFERENCE_PATTERNS = (
    r"(?<![\w.\[/-]){name}(?=\.[A-Za-z_])",  # modules, class paths: project.cli (not [project.x])
    r"(?<![\w-]){name}(?=/)",  # paths: project/cli.py
    r"(?<=-m ){name}(?![\w-])",  # python -m project
    r"(?<=\bimport ){name}(?![\w.-])",  # import project
    r"(?<=\bfrom ){name}(?= import\b)",  # from project import doctor
    r"(?<=[\"'`])(?<!\[\")(?<!\['){name}(?=[\"'`])",  # "project", `project` (not the key in ["project"])
    r"(?<=[\"'`]){name}(?=[*\[])",  # "project*", "project[dev]"
    r"(?<=`){name}(?= )",  # `project fit ...`: the console command in prose
    r"(?m)^{name}(?=\s*=\s*[\"']{name}[.:])",  # the console script: project = "project.cli:main"
    r"(?<==){name}(?![\w-])",  # option values: --job-name=project
    r"(?<=/){name}(?=:[\w.-])",  # container images: registry.example.com/project:latest
    r"(?<=:::){name}(?![\w-])",  # warning filters by module: error:::project
)


def file_edits(path: str, description: str) -> tuple[tuple[str, str], ...]:
    """Edits that put the new project's own words in place of this one's. Idempotent: a rendered project
    templates again cleanly, its description paragraph and authors line are replaced, not added to."""
    if path == "README.md":
        title = "# {{ cookiecutter.project_name }}\n\n{{ cookiecutter.description }}"
        return ((rf"\A# .*(?:\n\n{re.escape(description)}(?=\n))?", title),)
    if path == "pyproject.toml":
        lines = "description = {{ cookiecutter.description | tojson }}\n"
        lines += "authors = [{ name = {{ cookiecutter.author | tojson }} }]"
        return ((r"(?m)^description = .*$(?:\nauthors = .*$)?", lines),)
    return ()


PRE_GEN_HOOK = '''"""Stops cookiecutter before anything is written when the package name cannot be imported."""

import keyword
import sys

package_name = "{{ cookiecutter.package_name }}"
if not (package_name.isascii() and package_name.isidentifier()) or keyword.iskeyword(package_name):
    sys.exit(f"package_name must be a Python identifier (ASCII letters, digits, underscores), got {package_name!r}")
'''


def package_name(repo: Path) -> str:
    """The package pyproject.toml's setuptools section installs: ``project`` from ``project*``."""
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    [pattern] = config["tool"]["setuptools"]["packages"]["find"]["include"]
    return pattern.rstrip("*")


def committed_files(repo: Path, ref: str = "HEAD") -> Iterator[tuple[str, bytes, int]]:
    """(path, content, mode) of every file committed at REF: one consistent snapshot, nothing hand-listed."""
    result = subprocess.run(["git", "archive", "--format=tar", ref], cwd=repo, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"cannot read {ref} of {repo} with git: {result.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        for member in archive:
            if member.isfile():
                yield member.name, archive.extractfile(member).read(), member.mode


def raw(text: str) -> str:
    """TEXT as Jinja will print it verbatim: in raw blocks, with any endraw tag in TEXT printed as a string."""
    if not any(opener in text for opener in JINJA_OPENERS):
        return text
    parts = ENDRAW.split(text)  # text, tag, text, tag, ..., text
    return "".join(
        "{% raw %}" + part + "{% endraw %}" if i % 2 == 0 else "{{ " + json.dumps(part) + " }}"
        for i, part in enumerate(parts)
    )


def template_text(text: str, name: str, path: str = "", description: str = "") -> str:
    """TEXT as a Jinja template: package references become the package_name variable, all else verbatim.

    PATH picks the per-file edits; DESCRIPTION is this project's, replaced where the README repeats it.
    """
    edits = [(pattern.format(name=re.escape(name)), PACKAGE_VAR) for pattern in REFERENCE_PATTERNS]
    edits += file_edits(path, description)
    spans = sorted({(m.start(), m.end(), value) for pattern, value in edits for m in re.finditer(pattern, text)})
    pieces, position = [], 0
    for start, end, value in spans:
        if start < position:
            raise ValueError(f"{path}: overlapping replacements at offset {start}")
        pieces += [raw(text[position:start]), value]
        position = end
    pieces.append(raw(text[position:]))
    return "".join(pieces)


def template_path(path: str, name: str) -> Path:
    """PATH with the package folder as the variable: project/x.py -> {{cookiecutter.package_name}}/x.py."""
    parts = ["{{cookiecutter.package_name}}" if part == name else part for part in Path(path).parts]
    return Path(PROJECT_DIR, *parts)


def description(repo: Path) -> str:
    return tomllib.loads((repo / "pyproject.toml").read_text())["project"]["description"]


def cookiecutter_json(repo: Path) -> dict:
    return {
        "project_name": "My Lightning Project",
        "project_slug": "{{ cookiecutter.project_name | slugify }}",  # ASCII letters, digits, dashes
        "package_name": "{{ cookiecutter.project_slug.replace('-', '_') }}",
        "author": "Your Name",
        "description": description(repo),
    }


def make_template(repo: Path, out_dir: Path, ref: str = "HEAD") -> Path:
    """Writes the template of REPO at REF into OUT_DIR (which must be empty or absent) and returns OUT_DIR."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    name, words = package_name(repo), description(repo)
    for path, content, mode in committed_files(repo, ref):
        target = out_dir / template_path(path, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            target.write_text(template_text(content.decode("utf-8"), name, path, words), encoding="utf-8")
        except UnicodeDecodeError:  # binary: cookiecutter copies it without rendering
            target.write_bytes(content)
        target.chmod(mode)  # keeps scripts executable
    (out_dir / "cookiecutter.json").write_text(json.dumps(cookiecutter_json(repo), indent=2) + "\n")
    (out_dir / "hooks").mkdir()
    (out_dir / "hooks" / "pre_gen_project.py").write_text(PRE_GEN_HOOK)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the template into (empty or absent)")
    parser.add_argument("--ref", default="HEAD", help="the commit, branch or tag to make it from (default: HEAD)")
    args = parser.parse_args(argv)
    try:
        out_dir = make_template(Path(__file__).resolve().parents[1], args.out_dir, args.ref)
    except (FileExistsError, RuntimeError, ValueError) as error:
        parser.error(str(error))
    print(f"template written to {out_dir}; create a project with: cookiecutter {out_dir}")


if __name__ == "__main__":
    sys.exit(main())
