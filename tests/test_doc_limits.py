"""The documents' size limits, kept: the README is the front door (at most 200 lines, the manual
lives in docs/), and the findings page at most 250 (its long tables live on per-finding pages under
docs/results/). A limit met once keeps holding only if something fails when it is crossed."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("page, limit", [("README.md", 200), ("docs/results.md", 250)])
def test_a_front_page_stays_within_its_line_limit(page, limit):
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= limit, f"{page}: {len(lines)} lines, over its limit of {limit}: move detail to docs/"
