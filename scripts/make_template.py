"""Writes a cookiecutter template of this repository: every committed file but the template's own dated reports
(TEMPLATE_ONLY), with the package's name as a variable.

    python scripts/make_template.py ../lightning-template
    cruft create ../lightning-template           # asks for project_name, package_name, author, description
    python scripts/make_template.py ../lightning-template   # later: the template's next version, one more commit
    cd ../my-project && cruft update             # brings that version into the project, keeping its owner's edits

The repository stays the one source of truth: the template is generated, never edited. It is made from the last
commit, and refused while the working tree has uncommitted changes (they would be silently left out);
``--worktree`` makes it from the files as they are on disk instead, ``--ref`` from another commit.
Only real references to the package are replaced (see REFERENCE_PATTERNS), not the English
word; any text that Jinja would read (``{{``, ``{%``, ``{#``) is wrapped in raw blocks,
so it reaches the new project unchanged. The template is a git repository, one commit per version: cruft records
that commit in each project it creates (.cruft.json) and diffs two of them to update one. A project rendered by plain
cookiecutter is a git repository with one commit (the post-generation hook). Needs Python 3.11+ (tomllib).
"""

import argparse
import importlib.util
import io
import json
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import tomllib  # Python 3.11+: this is a maintainer's tool, the package itself runs on 3.10

PACKAGE_VAR = "{{ cookiecutter.package_name }}"
SLUG_VAR = "{{ cookiecutter.project_slug }}"
PROJECT_DIR = "{{cookiecutter.project_slug}}"
JINJA_OPENERS = ("{{", "{%", "{#")
ENDRAW = re.compile(r"(\{%[-+]?\s*endraw\s*[-+]?%\})")  # every spelling Jinja ends a raw block with

# Each pattern finds one kind of reference to the package NAME (substituted for {name}).
REFERENCE_PATTERNS = (
    r"(?<![\w.\[/-]){name}(?=\.[A-Za-z_])",  # modules, class paths: trainfleet.cli (not [project.x])
    r"(?<![\w-]){name}(?=/)",  # paths: trainfleet/cli.py
    r"(?<=-m ){name}(?![\w-])",  # python -m project
    r"(?<=\bimport ){name}(?![\w.-])",  # import project
    r"(?<=\bfrom ){name}(?= import\b)",  # from project import doctor
    r"(?<=[\"'`])(?<![\w)\]]\[[\"']){name}(?=[\"'`])",  # "project", ["project"] (not config["project"])
    r"(?<=[\"'`]){name}(?=[*\[])",  # "project*", "project[dev]"
    r"(?<=`){name}(?= )",  # `project fit ...`: the console command in prose
    r"(?<=usage: ){name}(?= )",  # usage: project [-c CONFIG] ...: the console command's usage line
    r"(?<=[\"']){name}(?= (?:fit|validate|test|predict|doctor|sweep|consolidate)\b)",  # "project fit"
    r"(?<=/bin/){name}(?![\w-])",  # /usr/local/bin/project: the console command's path
    r"(?m)^{name}(?=\s*=\s*[\"']{name}[.:])",  # the console script: project = "trainfleet.cli:main"
    r"(?<==){name}(?!\w)",  # option values: --job-name=project, --job-name=project-sweep
    r"(?<=/){name}(?=:[\w.-])",  # container images: registry.example.com/project:latest
    r"(?<=:::){name}(?![\w-])",  # warning filters by module: error:::project
    r"(?<=\[){name}(?=\\*\] )",  # log prefix: [project] resuming, r"\[project\] "
)
# What stays in this repository: the library (a project installs it, pinned: LIBRARY_REQUIREMENT), this script, the
# checks across Pythons and the lock files of the workspace (a project locks its own: POST_GEN_HOOK). A Markdown link
# to one reads as its words there.
TEMPLATE_ONLY = ("library/", "scripts/make_template.py", ".ci/pythons", ".ci/python_versions.py", "requirements.txt")
TEMPLATE_ONLY += ("uv.lock",)
# Lines of a file that concern the template only (the workspace, the library's tests), between two marker lines.
TEMPLATE_ONLY_LINES = re.compile(r"(?m)^.*\btemplate only\b.*\n(?:.*\n)*?.*\bend of template only\b.*\n")
TESTPATHS = 'testpaths = ["tests"]'  # a project's own tests (the library's are in this repository)
# The library, as a project depends on it: a git URL with the library's tag and folder (uv and pip both take it).
LIBRARY_REQUIREMENT = (
    '"trainfleet @ git+{{ cookiecutter.library_repository }}@trainfleet-v{version}#subdirectory=library",'
    "  # the machinery: a newer version is a newer tag here, then `uv sync`"
)
MARKDOWN_LINK = re.compile(r"\[([^\]]+)\]\(([^)#\s]+)[^)]*\)")
# Names that must be DNS labels (Kubernetes objects) or read as one word: the project's slug, dashes and all.
SLUG_PATTERNS = (r"(?<![\w.\[=-]){name}(?=-[a-z])",)  # project-fit, /tmp/project-slurm


def template_only(path: str) -> bool:
    return any(f"{path}/".startswith(folder) for folder in TEMPLATE_ONLY)


def unlink_template_only(text: str, path: str) -> str:
    """TEXT (the Markdown page at PATH) with its links to template-only files replaced by the links' words."""
    if not path.endswith(".md"):
        return text

    def words_if_template_only(link: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(path), link[2]))
        return link[1] if "://" not in link[2] and template_only(target) else link[0]

    return MARKDOWN_LINK.sub(words_if_template_only, text)


def file_edits(path: str, description: str, library_version: str = "") -> tuple[tuple[str, str], ...]:
    """Edits that put the new project's own words in place of this one's. Idempotent: a rendered project
    templates again cleanly, its description paragraph and authors line are replaced, not added to."""
    if path == "README.md":
        title = "# {{ cookiecutter.project_name }}\n\n{{ cookiecutter.description }}"
        return ((rf"\A# .*(?:\n\n{re.escape(description)}(?=\n))?", title),)
    if path == "pyproject.toml":
        lines = "description = {{ cookiecutter.description | tojson }}\n"
        lines += "authors = [{ name = {{ cookiecutter.author | tojson }} }]"
        requirement = LIBRARY_REQUIREMENT.replace("{version}", library_version)
        dependency = (r'(?m)(?<=^    )"trainfleet",.*$', requirement)
        return (r"(?m)^description = .*$(?:\nauthors = .*$)?", lines), dependency, (r"(?m)^testpaths = .*$", TESTPATHS)
    return ()


PRE_GEN_HOOK = '''"""Stops cookiecutter before anything is written when the package name cannot be imported."""

import keyword
import sys

package_name = "{{ cookiecutter.package_name }}"
if not (package_name.isascii() and package_name.isidentifier()) or keyword.iskeyword(package_name):
    sys.exit(f"package_name must be a Python identifier (ASCII letters, digits, underscores), got {package_name!r}")
'''

POST_GEN_HOOK = '''"""Locks the new project's packages (``uv lock``: the library's commit among them) and makes it a git
repository holding one commit of everything cookiecutter wrote.

Without a git identity configured, the template's author makes the commit. A failure leaves the project as written
and says so (a failing hook would make cookiecutter delete it). Not when cruft renders it: `cruft update` diffs two
renders of the template, where a repository of their own would be part of the diff; after `cruft create` the owner
commits, .cruft.json included (library/docs/development.md)."""

import os
import shutil
import subprocess
import sys

AUTHOR = {{ cookiecutter.author | tojson }}
MESSAGE = "New project from the Lightning template: " + {{ cookiecutter.project_name | tojson }}
RENDERED_BY_CRUFT = {{ "_commit" in cookiecutter }}  # cruft adds the template's commit to the context


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def lock() -> str:
    """Why the project could not be locked; empty when it was (uv resolves from the package index and the library's
    repository: with neither reachable, the first `uv sync` locks it)."""
    if shutil.which("uv") is None:
        return "uv is not installed"
    env = {k: v for k, v in os.environ.items() if k not in ("UV_LOCKED", "UV_FROZEN")}  # a lock is what is asked for
    done = subprocess.run(["uv", "lock", "--quiet"], capture_output=True, text=True, env=env)
    return "" if done.returncode == 0 else f"uv lock failed: {done.stderr.strip()[-500:]}"


def commit() -> str:
    """Why the project could not be committed; empty when it was."""
    if shutil.which("git") is None:
        return "git is not installed"
    identity = []
    for key, fallback in (("user.name", AUTHOR), ("user.email", "")):
        if git("config", key).returncode != 0:
            identity += ["-c", f"{key}={fallback}"]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", MESSAGE]):
        done = git(*identity, *step)
        if done.returncode != 0:
            return f"git {step[0]} failed: {done.stderr.strip()}"
    return ""


if not RENDERED_BY_CRUFT and (why := lock()):
    print(f"the project is written but not locked ({why}): uv lock", file=sys.stderr)
if not RENDERED_BY_CRUFT and (why := commit()):
    print(f"the project is written but not committed ({why}): git init && git add -A && git commit", file=sys.stderr)
'''

Files = dict[str, tuple[bytes, int]]  # path: (content, mode)
REPOSITORY = Path(__file__).resolve().parents[1]


class UncommittedChanges(RuntimeError):
    """The working tree differs from the commit the template would be made of."""


def package_name(pyproject: dict) -> str:
    """The package pyproject.toml's setuptools section installs: ``project`` from ``project*``."""
    [pattern] = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return pattern.rstrip("*")


def description(pyproject: dict) -> str:
    return pyproject["project"]["description"]


def read_pyproject(repo: Path) -> dict:
    return tomllib.loads((repo / "pyproject.toml").read_text())


def git(repo: Path, *args: str) -> bytes:
    result = subprocess.run(["git", *args], cwd=repo, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed in {repo}: {result.stderr.decode().strip()}")
    return result.stdout


def is_template_repository(path: Path) -> bool:
    """PATH holds an earlier version of a template this script wrote: its next version goes in as a new commit."""
    return (path / ".git").is_dir() and (path / "cookiecutter.json").is_file()


def clear_template(path: Path) -> None:
    """Removes an earlier version's files (its history stays): files the new version lacks are then deleted in it."""
    for child in path.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def source_version(repo: Path, ref: str, worktree: bool) -> str:
    """The commit the template is made of, as its commit message names it."""
    commit = git(repo, "rev-parse", "--short", "HEAD" if worktree else ref).decode().strip()
    return f"{commit} with uncommitted changes" if worktree and uncommitted_changes(repo) else commit


def commit_version(out_dir: Path, made_from: str) -> bool:
    """Commits OUT_DIR as the template's next version; False when it is the same as the last one.

    Every file is added, ignored or not: the project's own .gitignore sits inside the template."""
    if not (out_dir / ".git").is_dir():
        git(out_dir, "init", "-q")
    git(out_dir, "add", "-A", "--force")
    if not git(out_dir, "status", "--porcelain"):
        return False
    identity = []
    for key, fallback in (("user.name", "make_template.py"), ("user.email", "")):
        if subprocess.run(["git", "config", key], cwd=out_dir, capture_output=True).returncode != 0:
            identity += ["-c", f"{key}={fallback}"]
    git(out_dir, *identity, "commit", "-qm", f"Template of {made_from}")
    return True


def committed_files(repo: Path, ref: str = "HEAD") -> Files:
    """Every file committed at REF: one consistent snapshot, nothing hand-listed."""
    with tarfile.open(fileobj=io.BytesIO(git(repo, "archive", "--format=tar", ref))) as archive:
        return {m.name: (archive.extractfile(m).read(), m.mode) for m in archive if m.isfile()}


def working_tree_files(repo: Path) -> Files:
    """Every file the next commit could hold, as it is on disk: tracked and untracked ones, ignored ones aside."""
    listed = git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").decode().split("\0")
    paths = [path for path in listed if path and (repo / path).is_file()]  # a deleted tracked file is gone
    return {path: ((repo / path).read_bytes(), (repo / path).stat().st_mode & 0o777) for path in paths}


def uncommitted_changes(repo: Path) -> list[str]:
    """`git status --short` lines: changed, staged, deleted and untracked files (ignored ones aside)."""
    return git(repo, "status", "--porcelain", "--untracked-files=all").decode().splitlines()


def raw(text: str) -> str:
    """TEXT as Jinja will print it verbatim: in raw blocks, with any endraw tag in TEXT printed as a string.

    A TEXT ending in ``{`` (an f-string's brace) is wrapped too: before a variable's ``{{`` it would read as ``{{{``."""
    if not any(opener in text for opener in JINJA_OPENERS) and not text.endswith("{"):
        return text
    parts = ENDRAW.split(text)  # text, tag, text, tag, ..., text
    return "".join(
        "{% raw %}" + part + "{% endraw %}" if i % 2 == 0 else "{{ " + json.dumps(part) + " }}"
        for i, part in enumerate(parts)
    )


def template_text(text: str, name: str, path: str = "", description: str = "", library_version: str = "") -> str:
    """TEXT as a Jinja template: package references become the package_name variable, all else verbatim.

    PATH picks the per-file edits; DESCRIPTION is this project's, replaced where the README repeats it.
    """
    text = TEMPLATE_ONLY_LINES.sub("", text)
    edits = [(pattern.format(name=re.escape(name)), PACKAGE_VAR) for pattern in REFERENCE_PATTERNS]
    # A rendered project's slug is its package name with dashes (leaf-lab-slurm for leaf_lab): templated again too.
    slug = re.escape(name.replace("_", "-"))
    edits += [(pattern.format(name=slug), SLUG_VAR) for pattern in SLUG_PATTERNS]
    edits += file_edits(path, description, library_version)
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
    """PATH with the package folder as the variable: trainfleet/cli.py -> {{cookiecutter.package_name}}/cli.py."""
    parts = ["{{cookiecutter.package_name}}" if part == name else part for part in Path(path).parts]
    return Path(PROJECT_DIR, *parts)


def cookiecutter_json(pyproject: dict, library_repository: str) -> dict:
    return {
        "project_name": "My Lightning Project",
        "project_slug": "{{ cookiecutter.project_name | slugify }}",  # ASCII letters, digits, dashes
        "package_name": "{{ cookiecutter.project_slug.replace('-', '_') }}",
        "author": "Your Name",
        "description": description(pyproject),
        "library_repository": library_repository,  # where uv and pip fetch the library from (a git URL)
    }


def library_repository(repo: Path) -> str:
    """Where this repository is published (its ``origin``), else where it is on disk: the library's git URL."""
    origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=repo, capture_output=True, text=True)
    url = origin.stdout.strip() if origin.returncode == 0 else ""
    return url if "://" in url else repo.resolve().as_uri()


def make_template(repo: Path, out_dir: Path, ref: str = "HEAD", worktree: bool = False) -> Path:
    """Writes the template of REPO at REF (or of its working tree) into OUT_DIR and commits it there.

    OUT_DIR is empty, absent, or an earlier template (which gets the new version as its next commit). At HEAD it
    refuses a working tree with uncommitted changes, which the template would silently leave out."""
    if out_dir.exists() and any(out_dir.iterdir()) and not is_template_repository(out_dir):
        raise FileExistsError(f"{out_dir} is neither empty nor a template this script wrote")
    if worktree:
        files = working_tree_files(repo)
    elif ref == "HEAD" and (changes := uncommitted_changes(repo)):
        listed = ", ".join([line.strip() for line in changes[:8]] + ["..."] * (len(changes) > 8))
        raise UncommittedChanges(
            f"{repo} has uncommitted changes, which a template of its last commit would leave out ({listed}): "
            "commit them, or pass --worktree to make the template from the files as they are on disk"
        )
    else:
        files = committed_files(repo, ref)
    pyproject = tomllib.loads(files["pyproject.toml"][0].decode())
    if out_dir.exists():
        clear_template(out_dir)
    name, words = package_name(pyproject), description(pyproject)
    library = files.get("library/pyproject.toml")
    library_version = tomllib.loads(library[0].decode())["project"]["version"] if library else "0"
    for path, (content, mode) in files.items():
        if template_only(path):
            continue
        target = out_dir / template_path(path, name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = unlink_template_only(content.decode("utf-8"), path)
            target.write_text(template_text(text, name, path, words, library_version), encoding="utf-8")
        except UnicodeDecodeError:  # binary: cookiecutter copies it without rendering
            target.write_bytes(content)
        target.chmod(mode)  # keeps scripts executable
    context = cookiecutter_json(pyproject, library_repository(repo))
    (out_dir / "cookiecutter.json").write_text(json.dumps(context, indent=2) + "\n")
    (out_dir / "hooks").mkdir()
    (out_dir / "hooks" / "pre_gen_project.py").write_text(PRE_GEN_HOOK)
    (out_dir / "hooks" / "post_gen_project.py").write_text(POST_GEN_HOOK)
    commit_version(out_dir, source_version(repo, ref, worktree))
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write the template into (empty or absent)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--ref", default="HEAD", help="the commit, branch or tag to make it from (default: HEAD)")
    source.add_argument("--worktree", action="store_true", help="make it from the files on disk, uncommitted or not")
    args = parser.parse_args(argv)
    try:
        out_dir = make_template(REPOSITORY, args.out_dir, args.ref, args.worktree)
    except (FileExistsError, RuntimeError, ValueError) as error:
        parser.error(str(error))
    made_from = "the working tree, uncommitted changes included" if args.worktree else args.ref
    print(f"template of {made_from} committed in {out_dir}; create a project with: cruft create {out_dir}")
    print("(or bring this version into a project made from it: cd <project> && cruft update)")
    print(f"projects install the library from {library_repository(REPOSITORY)} at its tag (git tag -l 'trainfleet-v*')")
    if importlib.util.find_spec("cruft") is None:
        print("cruft is not installed here: pip install cruft (it is in the dev extra)")


if __name__ == "__main__":
    sys.exit(main())
