"""scripts/paired_gap.py: same-seed gaps to a baseline, on hand-written metrics.json files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from script_loader import load_script

paired_gap = load_script("paired_gap")


def write(root: Path, variant: str, seed: int, value: float) -> None:
    run = root / variant / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"test/iw_nll": value, "test/kl": 0.5}))


def test_gaps_pair_by_seed(tmp_path, capsys):
    for seed, value in ((1, 10.0), (2, 12.0), (3, 14.0)):
        write(tmp_path, "lm", seed, value)
    for seed, value in ((1, 11.0), (2, 14.0), (3, 15.0)):
        write(tmp_path, "a", seed, value)
    write(tmp_path, "b", 2, 13.5)  # one seed in common: a gap, no s.d.
    write(tmp_path, "c", 4, 99.0)  # no seed in common: no row
    rows = paired_gap.gaps(paired_gap.read(tmp_path, "test/iw_nll"), "lm")
    assert [r["variant"] for r in rows] == ["a", "b"]
    a, b = rows
    assert a["gaps"] == [1.0, 2.0, 1.0] and a["mean"] == pytest.approx(4 / 3)
    assert a["std"] == pytest.approx(math.sqrt(1 / 3))  # sample s.d. of 1, 2, 1
    assert a["unpaired_std"] == pytest.approx(math.sqrt(13 / 3))  # of 11, 14, 15: larger than the paired one
    assert b["seeds"] == [2] and b["mean"] == 1.5 and b["std"] is None
    assert paired_gap.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[2] == "| a | 3 | +1.33 ± 0.58 | 1: +1.00, 2: +2.00, 3: +1.00 | 2.08 |"
    assert out[3] == "| b | 1 | +1.50 | 2: +1.50 | – |"


def test_missing_baseline_and_bad_json_name_the_cause(tmp_path):
    write(tmp_path, "a", 1, 1.0)
    with pytest.raises(SystemExit, match="--baseline lm: no run of it has the metric"):
        paired_gap.gaps(paired_gap.read(tmp_path, "test/iw_nll"), "lm")
    bad = tmp_path / "lm" / "seed1"
    bad.mkdir(parents=True)
    (bad / "metrics.json").write_text("{not json")
    with pytest.raises(SystemExit, match=r"lm/seed1/metrics.json: not valid JSON .*line 1"):
        paired_gap.read(tmp_path, "test/iw_nll")
