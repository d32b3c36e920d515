"""Every link between the README and the `docs/` pages leads somewhere: the file exists and,
where a link names a heading (`#the-dump`), the page has that heading, by GitHub's rule for
anchors. The README stays the short path a user walks (at most 900 lines); the rest lives
in `docs/`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside code fences and inline code."""
    outside = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", outside)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to
    hyphens."""
    fenced = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found = set()
    for title in re.findall(r"^#+ (.*)$", fenced, re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text()))
        if not re.match(r"[a-z]+://", target)
    ]


def test_the_anchor_rule_is_githubs() -> None:
    page = ROOT / "README.md"
    assert {"quick-start", "generation-rows-of-what-the-model-writes"} <= anchors(page)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_of_a_page_leads_somewhere(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_is_the_short_path() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 900


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    readme = links(ROOT / "README.md")
    linked = {(ROOT / target.partition("#")[0]).resolve() for target in readme}
    pages = set((ROOT / "docs").glob("*.md"))
    assert {p.resolve() for p in pages} <= linked
