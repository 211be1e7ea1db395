"""`python -m seqvae.analysis.estimator_gap`: two estimates of one quantity on the same checkpoints,
their gap by text (one checkpoint) and by seed (a variant's runs), on constructed per-text files."""

from __future__ import annotations

import math
import statistics

import pytest
from test_compare import make_run, metrics

from seqvae.analysis import estimator_gap
from seqvae.analysis.differences import t975

# per seed: (nll_bar, iw_nll) of four texts; the third text of seed 2 has no NLL-bar (NaN)
TEXTS = {
    1: [(300.0, 310.0), (290.0, 301.0), (305.0, 314.0), (280.0, 292.0)],
    2: [(299.0, 311.0), (288.0, 300.0), (float("nan"), 315.0), (281.0, 290.0)],
    3: [(301.0, 309.0), (289.0, 302.0), (304.0, 316.0), (279.0, 291.0)],
}


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "results"
    for seed, texts in TEXTS.items():
        run = make_run(root, "ivae", seed, metrics(300.0, 60.0))
        rows = ["index,line,tokens,neg_elbo,kl,iw_nll,iw_se,nll_bar"]
        rows += [f"{i},{i + 1},10,320.0,5.0,{iw},0.1,{bar}" for i, (bar, iw) in enumerate(texts)]
        (run / "per_text.csv").write_text("\n".join(rows) + "\n")
    return root / "yahoo" / "ivae"


def test_gap_by_text_and_by_seed_exact(runs):
    (entry,) = estimator_gap.gaps([f"{runs}/seed*"], "nll_bar", "iw_nll", "per_text.csv")
    per_run = []
    for run, (seed, texts) in zip(entry["runs"], TEXTS.items()):
        d = [bar - iw for bar, iw in texts if math.isfinite(bar)]
        half = t975(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        assert run["seed"] == seed and run["texts"] == len(d) and run["texts_in_file"] == 4
        assert run["by_text"]["diff"] == pytest.approx(statistics.mean(d))
        assert run["by_text"]["hi"] - run["by_text"]["lo"] == pytest.approx(2 * half)
        per_run.append(statistics.mean(d))
    half = t975(2) * statistics.stdev(per_run) / math.sqrt(3)
    assert entry["by_seed"]["diff"] == pytest.approx(statistics.mean(per_run))
    assert entry["by_seed"]["lo"] == pytest.approx(statistics.mean(per_run) - half)


def test_markdown_marks_intervals_excluding_zero_and_names_dropped_texts(runs, capsys):
    assert estimator_gap.main([f"{runs}/seed*", "--estimate", "nll_bar"]) == 0
    out = capsys.readouterr().out
    seed2 = next(line for line in out.splitlines() if line.startswith("| ivae/seed2 |"))
    assert "| 3 of 4 |" in seed2 and seed2.split("|")[5].strip().endswith("]*")  # every text's gap < 0
    assert "| **ivae** |" in out and "seed, n = 3" in out


def test_a_directory_without_results_is_skipped_with_this_commands_name(runs, capsys):
    (runs / "seed9").mkdir()  # an unfinished run: no metrics.json (the notice said "seqvae compare: skipped")
    assert estimator_gap.main([f"{runs}/seed*", "--estimate", "nll_bar"]) == 0
    assert capsys.readouterr().err.startswith("estimator_gap: skipped 1 directories without metrics.json")


def test_a_missing_column_is_one_line_naming_the_file(runs, capsys):
    assert estimator_gap.main([f"{runs}/seed1", "--estimate", "dual_kl"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "seed1/per_text.csv: no column dual_kl" in err
