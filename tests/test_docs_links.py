"""Every relative link and image in README.md and docs/ points at a file or folder that exists, and every
`#anchor` into a Markdown file names one of its headings."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def links(page: Path) -> list[str]:
    """The targets of the Markdown links and images of `page`, code blocks left out."""
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of `page`'s headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+\s+(.*?)\s*$", FENCE.sub("", page.read_text(encoding="utf-8")), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    assert broken_links(page) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "guide.md").write_text("# A guide\n\n## Set-up\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](guide.md) [ok](guide.md#set-up) ![gone](images/gone.png) [bad](guide.md#nowhere) [web](https://x.org)\n"
        "```\n[in code](not-checked.md)\n```\n"
    )
    assert broken_links(page) == ["images/gone.png", "guide.md#nowhere"]


def test_the_readme_shows_both_pictures_and_stays_short():
    readme = ROOT / "README.md"
    assert {"docs/images/storyboard.png", "docs/images/demo.png"} <= set(links(readme))
    assert len(readme.read_text(encoding="utf-8").splitlines()) <= 250
