"""Every relative link in the repository's Markdown resolves: the file is there, and so is the heading an
anchor names."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def markdown_files() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.split()
    # not a git checkout (an sdist): every .md but local state
    except (OSError, subprocess.CalledProcessError):
        return sorted(
            p for p in REPO.rglob("*.md") if not {".venv", "runs", "site"} & set(p.relative_to(REPO).parts))
    return sorted(REPO / p for p in listed if (REPO / p).is_file())


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def links(path: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", path.read_text()))]


def test_the_user_docs_are_found():
    names = {p.relative_to(REPO).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/run.md", "docs/tasks.md", "bench/README.md", "examples/README.md"} <= names


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(path):
    broken = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, f"{path.relative_to(REPO)}: " + "; ".join(broken)
