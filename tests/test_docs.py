"""The README and docs/ point only at what exists, and the README stays a newcomer's page."""

import re
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# A configs/ or scripts/ path named in prose or commands: configs/digits.yaml, scripts/slurm.sbatch, ...
NAMED_PATH = re.compile(r"(?<![\w./-])((?:configs/|scripts/|docs/|tests/|project/)[\w./-]*\w)")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_and_named_path_exists(page):
    text = page.read_text()
    links = [link for link in LINK.findall(text) if "://" not in link]
    missing = [link for link in links if not (page.parent / link).exists()]
    missing += [path for path in NAMED_PATH.findall(text) if not (REPO / path).exists() and "*" not in path]
    assert missing == []


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert {Path(link).name for link in LINK.findall(readme) if link.startswith("docs/")} == {
        page.name for page in PAGES[1:]
    }
