"""scripts/build_results.py's finding pages: docs/results.md keeps each finding's key table and links the long
ones, on docs/results/*.md; the prose of either may quote the other's tables, no other page's."""

from __future__ import annotations

from pathlib import Path

from script_loader import load_script

build_results = load_script("build_results")


def block(body: str) -> str:
    return f"<!-- compare 'docs/results/x/*/seed*' -->\n{body}\n<!-- /compare -->\n"


def test_findings_page_quotes_its_finding_pages_tables_and_no_other_pages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs/results/run_folder").mkdir(parents=True)
    findings = "max − last: +1.00 [+0.50, +1.50]*, and a typo +1.00 [+0.50, +1.51]*\n" + block("| max | +2.00 [+1.00, +3.00]* |")
    (tmp_path / "docs/results.md").write_text(findings)
    (tmp_path / "docs/results/short_grid.md").write_text("see +2.00 [+1.00, +3.00]*\n" + block("| max | +1.00 [+0.50, +1.50]* |"))
    (tmp_path / "docs/results/generated_table.md").write_text("| no | blocks |\n")  # not a finding page
    (tmp_path / "docs/results/run_folder/README.md").write_text(block("| ref | +1.00 [+0.50, +1.51]* |"))  # not top-level

    assert build_results.finding_pages() == ["docs/results/short_grid.md"]
    assert build_results.pages()[:2] == ["docs/results.md", "docs/results/short_grid.md"]
    shared = build_results.shared_tables(Path("docs/results.md"))
    assert "+1.00 [+0.50, +1.50]*" in shared and "+2.00" not in shared and "+1.51" not in shared
    own = "\n".join(m["body"] for m in build_results.BLOCK.finditer(findings))
    missing = build_results.unquoted(findings, "docs/results.md", own + "\n" + shared)
    assert missing == ["docs/results.md:1: '+1.00 [+0.50, +1.51]*' is in no generated table (looked for '+1.00 [+0.50, +1.51]*')"]
    # the finding page quotes the findings page's table the same way
    assert "+2.00 [+1.00, +3.00]*" in build_results.shared_tables(Path("docs/results/short_grid.md"))
    # any other page (the archived notebook, a run folder's README) quotes only its own tables
    assert build_results.shared_tables(Path("docs/notes/results_lab_2026-12.md")) is None
    assert build_results.shared_tables(Path("docs/results/run_folder/README.md")) is None
