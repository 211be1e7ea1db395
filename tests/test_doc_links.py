"""Every relative link in README.md and docs/ reaches a file, and every #anchor a heading of it (GitHub's
heading slugs): a moved section once left two links to nothing."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation but hyphens removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.*)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M):
        s = slug(heading)
        seen[s] = seen.get(s, -1) + 1
        found.add(s if seen[s] == 0 else f"{s}-{seen[s]}")  # a repeated heading gets -1, -2, ...
    return found


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # commands in code blocks are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, fragment = target.partition("#")
            file = page.parent / path if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(root)}: {target}: no such file")
            elif fragment and file.suffix == ".md" and fragment not in anchors(file):
                broken.append(f"{page.relative_to(root)}: {target}: no such heading in {file.name}")
    return broken


def test_slugs_follow_github():
    assert slug("The paper's Figures 2–3: encoder features and validation KL") == (
        "the-papers-figures-23-encoder-features-and-validation-kl"
    )
    assert slug("`seqvae compare`: tables, *intervals* and [plots](x.md)") == "seqvae-compare-tables-intervals-and-plots"


def test_every_link_in_the_readme_and_docs_reaches_its_file_and_heading():
    assert broken_links(REPO) == []


def test_a_link_to_a_missing_heading_or_file_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Its part\n\n```\n[not](a link.md)\n```\n")
    links = "[ok](docs/a.md#its-part) [gone](docs/a.md#old-part) [none](docs/b.md) [web](https://x.org/#y)"
    (tmp_path / "README.md").write_text(links + "\n")
    assert broken_links(tmp_path) == [
        "README.md: docs/a.md#old-part: no such heading in a.md",
        "README.md: docs/b.md: no such file",
    ]
