"""The published-table view (`python -m seqvae.analysis.paper_table`, the `paper_table` blocks of
docs/results/table1.md): the paper's numbers and differences, seqvae's cells as `seqvae compare
--baseline` computes them, rows not run named with their sweep, bad declarations refused in one line."""

from __future__ import annotations

import json
import math
import statistics

import pytest
import yaml

from seqvae.analysis import compare, paper_table
from seqvae.analysis.differences import t975
from tests.test_compare import make_run, metrics

NLL = {"lm": [100.0, 101.0, 103.0], "last": [104.0, 104.5, 108.0], "max": [101.0, 104.0, 103.5]}


@pytest.fixture
def grid(tmp_path):
    """runs under tmp/results/yahoo/{lm,last,max}/seed1-3, a sweep declaring ivae too, and a declaration."""
    root = tmp_path / "results"
    for variant, values in NLL.items():
        for seed, nll in enumerate(values, 1):
            make_run(root, variant, seed, metrics(nll, 60.0), pooling=variant)
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"variants": [{"name": v} for v in ("lm", "last", "max", "ivae")]}))
    spec = {
        "source": "a paper's Table 1",
        "estimators": {
            "iw500": {"short": "IW", "what": "IW-NLL"},
            "exact": {"short": "exact", "what": "exact"},
            "nll_bar": {"short": "NLL-bar", "what": "not a bound"},
        },
        "datasets": {
            "yahoo": {
                "title": "Yahoo",
                "grids": [{"name": "tiny", "about": "three seeds", "roots": [str(root / "yahoo")], "sweeps": [str(sweep)]}],
            }
        },  # fmt: skip
        "rows": [
            {"row": "LSTM-LM", "runs": ["lm"], "baseline": True, "estimator": "exact", "yahoo": {"nll": 328.0}},
            {"row": "SeqVAE", "runs": ["last"], "yahoo": {"nll": 328.6, "kl": 0.0, "mi": 0.0, "au": 0}},
            {"row": "MaxPool", "runs": ["max"], "yahoo": {"nll": 327.2, "kl": 3.7, "mi": 2.5, "au": 9}},
            {"row": "iVAE", "runs": ["ivae", "ivae_sgd"], "estimator": "nll_bar", "yahoo": {"nll_bar": 309.5, "au": 32}},
        ],
    }
    path = tmp_path / "table1.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, root


def render(capsys, *argv) -> tuple[int, str, str]:
    rc = paper_table.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def row_cells(out: str, variant: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith("|") and f"| {variant} |" in line)
    return [c.strip() for c in line.strip("|").split("|")]


def test_paper_differences_and_seqvae_interval_by_seed(grid, capsys):
    path, _ = grid
    rc, out, _ = render(capsys, path)
    assert rc == 0
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == ["LSTM-LM", "SeqVAE", "MaxPool", "iVAE", "↳"]  # the paper's order; iVAE's second protocol
    d = [m - b for m, b in zip(NLL["max"], NLL["lm"])]  # +1.0, +3.0, +0.5
    half = t975(2) * statistics.stdev(d) / math.sqrt(3)
    mean = statistics.mean(d)
    cells = row_cells(out, "max")
    assert cells[2] == "-0.8"  # 327.2 − 328.0: the paper's own difference to its LM
    assert cells[7] == "3" and cells[8] == f"{statistics.mean(NLL['max']):.2f} ± {statistics.stdev(NLL['max']):.2f}"
    assert cells[9] == f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]" + ("*" if mean - half > 0 else "")
    assert row_cells(out, "lm")[9] == "baseline" and row_cells(out, "lm")[1] == "328.0 (exact)"


def test_rows_not_run_name_their_sweep_and_other_estimators_get_no_paper_difference(grid, capsys):
    path, _ = grid
    _, out, _ = render(capsys, path)
    ivae = row_cells(out, "ivae")
    assert ivae[1] == "309.5 (NLL-bar)" and ivae[2] == "–"  # not the others' estimator: no difference to the LM
    assert ivae[8].startswith("not run (") and "sweep.yaml" in ivae[8]
    assert row_cells(out, "ivae_sgd")[8] == "not in this grid"


def test_json_cells_are_compares(grid, capsys):
    """The same runs through `seqvae compare --baseline --format json` give the same means, n and interval."""
    path, root = grid
    rc, out, _ = render(capsys, path, "--format", "json")
    assert rc == 0
    rows = {r["variant"]: r for r in json.loads(out)["tables"][0]["rows"]}
    argv = [f"{root}/yahoo/*/seed*", "--label", "dir", "--baseline", f"{root}/yahoo/lm/seed*", "--format", "json"]
    assert compare.main(argv) == 0
    theirs = {r["label"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    for variant in ("last", "max"):
        assert rows[variant]["n"] == 3
        assert rows[variant]["stats"]["iw_nll"] == theirs[variant]["iw_nll"]
        assert rows[variant]["difference"] == theirs[variant]["difference"]["iw_nll"]
    assert "n" not in rows["ivae"] and rows["ivae"]["paper"] == {"nll_bar": 309.5, "au": 32}


def test_a_declaration_naming_an_unknown_estimator_is_refused_in_one_line(grid, capsys):
    path, _ = grid
    spec = yaml.safe_load(path.read_text())
    spec["rows"][2]["estimator"] = "wang"
    path.write_text(yaml.safe_dump(spec))
    rc, out, err = render(capsys, path)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "rows[3] (MaxPool): estimator 'wang'" in err and str(path) in err


@pytest.mark.parametrize("numbers, says", [
    ({"nll": 327.2, "kll": 3.7}, "rows[3] (MaxPool).yahoo: 'kll' is not a column of the table"),  # was a blank cell
    ({"nll": "327.2"}, "rows[3] (MaxPool).yahoo.nll: expected a number as the paper prints it; got '327.2'"),
    ([327.2], "rows[3] (MaxPool).yahoo: expected the paper's numbers as a mapping"),
])  # fmt: skip
def test_a_row_whose_numbers_are_misspelt_or_not_numbers_is_refused_in_one_line(grid, capsys, numbers, says):
    path, _ = grid
    spec = yaml.safe_load(path.read_text())
    spec["rows"][2]["yahoo"] = numbers
    path.write_text(yaml.safe_dump(spec))
    rc, out, err = render(capsys, path)
    assert rc == 2 and out == "" and err.count("\n") == 1 and says in err, err


def test_committed_table1_lists_every_row_of_the_paper():
    spec = paper_table.read_declaration(paper_table.Path("docs/results/table1.yaml"))
    paper_rows = [r["row"] for r in spec["rows"] if r.get("yahoo") or r.get("yelp")]
    assert len([r for r in paper_rows if r != "SA-VAE"]) == 11  # the paper's 11 rows (SA-VAE: He et al.'s)
    assert {r["row"]: r["yahoo"].get("nll", r["yahoo"].get("nll_bar")) for r in spec["rows"] if r.get("yahoo")}[
        "SeqVAE + MaxPool"
    ] == 327.2


def test_a_declaration_read_from_elsewhere_is_refused_not_rendered_empty(grid, capsys, monkeypatch, tmp_path):
    path, root = grid
    spec = yaml.safe_load(path.read_text())
    spec["datasets"]["yahoo"]["grids"][0]["roots"] = ["results/yahoo"]  # relative, as the committed declaration's
    path.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(root)  # not where results/ is
    rc, out, err = render(capsys, path)
    assert rc == 2 and out == "" and "grid 'tiny': none of its roots is a directory (results/yahoo)" in err
    monkeypatch.chdir(tmp_path)
    assert render(capsys, path)[0] == 0
