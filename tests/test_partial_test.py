"""A test cut short by `trainer.limit_test_batches` says so (`rundir/results.py`'s `texts_tested`):
metrics.json's `tested_texts` and a `partial_test` record that says broken, and `seqvae compare`
marks every metric of such a run with †, not only the posterior's. The CLI end to end:
tests/test_cli.py's `test_a_partial_test_says_how_many_texts_it_tested`."""

from __future__ import annotations

import json

from test_compare import make_run, md_rows, metrics, run_compare

from seqvae.rundir.results import texts_tested


def test_a_full_test_records_its_count_and_no_check(capsys):
    assert texts_tested(30, 30, 1.0) == {"tested_texts": 30}
    assert capsys.readouterr().err == ""
    assert texts_tested(29, 30, 0.99)["partial_test"]["texts"] == 29  # one text short is short


def test_a_partial_test_is_a_broken_record_that_marks_every_metric(capsys):
    out = texts_tested(16, 30, 1)
    record = out["partial_test"]
    assert out["tested_texts"] == 16
    assert record["broken"] is True and record["marks"] == "all"
    assert (record["texts"], record["of"], record["limit_test_batches"]) == (16, 30, 1)
    assert record["title"] == "tested on 16 of the test file's 30 texts"
    err = capsys.readouterr().err
    assert err == "seqvae: warning: tested on 16 of the test file's 30 texts (trainer.limit_test_batches 1): a partial test\n"


def test_compare_marks_every_column_of_a_partial_test_and_says_why(tmp_path, capsys):
    partial = texts_tested(16, 30, 1)
    capsys.readouterr()
    for seed in (1, 2, 3):
        make_run(tmp_path, "full", seed, metrics(100.0 + seed, 60.0) | {"tested_texts": 30}, latent_dim=8)
        part = metrics(90.0 + seed, 60.0) | (partial if seed == 2 else {"tested_texts": 30})
        make_run(tmp_path, "part", seed, part, latent_dim=16)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    assert rc == 0
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    rows = md_rows(out)
    shown = [c for c in rows["part"] if c != "–"]
    assert shown and all(c.endswith("†") for c in shown[1:]), rows["part"]  # the first cell: n
    assert rows["part"][headers.index("feature cos")].endswith("†")  # not a posterior metric: marked all the same
    assert not any("†" in c for c in rows["full"])
    assert lines[-1] == (
        "- † tested on 16 of the test file's 30 texts in runs part (seed2): see metrics.json partial_test; "
        "every test/ metric is a mean over those texts only (trainer.limit_test_batches), not a full test"
    )
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir", "--format", "json")
    by_label = {r["label"]: r for r in json.loads(out)["rows"]}
    assert "feature_cos" in by_label["part"]["unreliable"] and "unreliable" not in by_label["full"]
