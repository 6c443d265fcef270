"""The repository paths a project's docs and comments name, and which of them it does not have.

Docs are its Markdown pages (their text and relative links); comments are the comments and docstrings of its Python
files and the comments of its shell scripts and configs. A path is named by its top folder (``docs/performance.md``,
``tests/fixtures/slurm_cluster.sh``): one of the folders the repository has at its top. Bare page names
(``README.md``) must be the name of one of its files."""

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
SHELL_LIKE = (".sh", ".sbatch", ".yaml", ".yml", ".toml", ".cfg")
HASH_COMMENT = re.compile(r"(?:^|\s)#(.*)$", re.MULTILINE)
MARKDOWN_PAGE = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")


def tracked_files(root: Path) -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [path for path in listed.split() if (root / path).is_file()]


def python_comments(source: str) -> str:
    """The comments and docstrings of SOURCE, one per line."""
    texts = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            texts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(texts)


def prose(path: str, text: str) -> str:
    """What in the file at PATH is written for a reader: a page whole, the comments of code."""
    if path.endswith(".md"):
        return text
    if path.endswith(".py"):
        return python_comments(text)
    if path.endswith(SHELL_LIKE) or text.startswith("#!"):
        return "\n".join(HASH_COMMENT.findall(text))
    return ""


def missing_paths(root: Path, skip: tuple[str, ...] = (), beside: Path | None = None) -> dict[str, list[str]]:
    """For each file of ROOT (but those under SKIP), the paths its docs or comments name that ROOT does not have (nor
    BESIDE, the repository a library's prose may also name: the template's configs, its project)."""
    files = tracked_files(root)
    known = files + (tracked_files(beside) if beside else [])
    folders = sorted({path.split("/")[0] for path in known if "/" in path})
    named = re.compile(rf"(?<![\w./-])((?:{'|'.join(map(re.escape, folders))})/[\w./-]*\w)(?![\w{{<*])")
    names = {Path(path).name for path in known}
    bases = [root] if beside is None else [root, beside]
    missing: dict[str, list[str]] = {}
    for path in files:
        if path.startswith(skip) or not (text := read_text(root / path)):
            continue
        words = prose(path, text)
        found = [name for name in named.findall(words) if not any((base / name).exists() for base in bases)]
        found += [page for page in MARKDOWN_PAGE.findall(words) if page not in names]
        if path.endswith(".md"):
            links = [link for link in LINK.findall(text) if "://" not in link and not link.startswith("mailto:")]
            found += [link for link in links if not (root / path).parent.joinpath(link).exists()]
        if found:
            missing[path] = found
    return missing


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:  # a binary file: no prose
        return ""
