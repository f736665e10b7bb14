"""The repository's documentation stands alone: every link in the README and docs/ points
at a file inside the repository (anchors at a heading of that file), nothing links out,
and nothing cites a design document the reader does not have."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
APPS = ("api", "charges", "customers", "jobs", "merchants", "sandbox", "vpay", "webhooks", "tests", "bench")
SOURCES = [path for app in APPS for path in (ROOT / app).rglob("*.py") if path.name != Path(__file__).name]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    out = set()
    for line in CODE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_points_inside_the_repository(page):
    text = CODE.sub("", page.read_text())
    for target in LINK.findall(text):
        assert not re.match(r"[a-z]+:", target) or target.startswith("http://127.0.0.1"), f"links out: {target}"
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_relative_to(ROOT) and resolved.exists(), f"{target}: no such file in the repository"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{target}: no such heading"


def test_nothing_cites_a_design_document_outside_the_repository():
    for path in [*PAGES, *SOURCES]:
        text = path.read_text()
        assert "../shared" not in text and "DESIGN §" not in text and "DESIGN.md" not in text, path


def test_every_setting_in_env_example_is_documented():
    """`.env.example` lists every setting; each is explained in the README or docs/."""
    names = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]{3,})=", (ROOT / ".env.example").read_text(), re.M))
    documented = "".join(page.read_text() for page in PAGES)
    assert names and not sorted(n for n in names if n not in documented)
