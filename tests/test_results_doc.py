"""docs/results.md: its generated tables match the committed result files (scripts/build_results.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_loader import load_script

REPO = Path(__file__).resolve().parents[1]


def build_results():
    return load_script("build_results")


def test_committed_results_doc_is_up_to_date(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # main() changes to the repository root; this restores the cwd after
    assert build_results().main(["--check"]) == 0, capsys.readouterr().err


def test_stale_table_is_named_then_rebuilt(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    mod = build_results()
    doc = tmp_path / "doc.md"
    marker = "<!-- compare docs/results/yahoo10k/last/seed1 docs/results/yahoo10k/max/seed1 -->"
    doc.write_text(f"# t\n\nprose\n{marker}\n| old | table |\n<!-- /compare -->\nmore prose\n")
    assert mod.main([str(doc), "--check"]) == 1
    assert capsys.readouterr().err == f"out of date: {doc}:4: {marker} (run python scripts/build_results.py)\n"
    assert mod.main([str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith(f"# t\n\nprose\n{marker}\n| run | n | IW-NLL |") and text.endswith("<!-- /compare -->\nmore prose\n")
    nll = json.loads((REPO / "docs/results/yahoo10k/max/seed1/metrics.json").read_text())["test/iw_nll"]
    assert f"| pooling=max | 1 | {nll:.2f} |" in text and "| old |" not in text
    assert mod.main([str(doc), "--check"]) == 0


def test_former_paired_gap_block_names_its_replacement(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- paired_gap docs/results/yahoo10k_short -->\n| old |\n<!-- /paired_gap -->\n")
    with pytest.raises(SystemExit) as exit_:
        build_results().main([str(doc), "--check"])
    assert exit_.value.code == (f"{doc}:1: paired_gap blocks are gone: use <!-- compare 'docs/results/yahoo10k_short/*/seed*' "
                                "--label dir --baseline 'docs/results/yahoo10k_short/lm/seed*' -->")  # fmt: skip
