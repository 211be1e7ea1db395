"""`seqvae compare --baseline`, cell by cell (issue 35): non-finite and missing values (n and t per
cell), degenerate intervals, by-text labels, mixed K and seeds needed. Fixtures as in test_compare.py."""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from test_compare import T2, diff_runs, make_run, md_rows, metrics, run_compare, set_texts, text_pair, vs_base

from seqvae.analysis import compare

T1 = 12.706204736  # t(0.975, 1): an interval over 2 seeds


def edit(root, variant, seed, **changes):
    """Sets (or, with None, removes) metrics.json keys of one run; NaN is written as json writes it."""
    path = root / "yahoo" / variant / f"seed{seed}" / "metrics.json"
    m = json.loads(path.read_text())
    for key, v in changes.items():
        key = key.replace("__", "/")
        m.pop(key) if v is None else m.__setitem__(key, v)
    path.write_text(json.dumps(m))


def footnotes(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("- ")]


@pytest.fixture
def nan_runs(tmp_path):
    """base and x over seeds 1-3 (x − base IW-NLL d = 2, 3, 1); x seed 2 has feature EV1 NaN, seed 3 KL NaN."""
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "x", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)
    edit(tmp_path, "x", 2, test__feature_ev1=math.nan)
    for seed, kl in ((1, 3.0), (2, 5.0), (3, math.nan)):
        edit(tmp_path, "x", seed, test__kl=kl)  # d = 1, 3 on seeds 1, 2
    return tmp_path


def test_a_nan_never_tracebacks_and_is_counted(nan_runs, capsys):
    rc, out, err = run_compare(capsys, f"{nan_runs}/yahoo/x/seed*", "--format", "json")
    assert rc == 0, err
    (row,) = json.loads(out)["rows"]
    ev1 = [0.5 + 102 / 1000, 0.5 + 104 / 1000]  # seeds 1 and 3
    assert row["feature_ev1"] == {"mean": pytest.approx(statistics.fmean(ev1)), "std": pytest.approx(statistics.stdev(ev1)),
                                  "n": 2, "nonfinite": 1}  # fmt: skip
    assert row["iw_nll"] == {"mean": pytest.approx(310 / 3), "std": pytest.approx(statistics.stdev([102, 104, 104]))}
    rc, out, _ = run_compare(capsys, f"{nan_runs}/yahoo/x/seed*")
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[headers.index("feature EV1")] == "0.603 ± 0.001 (n=2; 1 non-finite)"
    assert cells[headers.index("KL")] == "4.00 ± 1.41 (n=2; 1 non-finite)"


def test_a_nan_goes_through_the_baseline_with_n_and_t_of_its_cell(nan_runs, capsys):
    rc, out, err = vs_base(capsys, nan_runs)
    assert rc == 0, err
    rows = md_rows(out)
    assert rows["x"][:3] == ["3", "seed, n=3", "+2.00 [-0.48, +4.48]"]
    half = T1 * statistics.stdev([1.0, 3.0]) / math.sqrt(2)
    assert rows["x"][4] == f"+2.00 [{2 - half:+.2f}, {2 + half:+.2f}] (n=2)"  # KL over seeds 1, 2: t for 1 df
    (line,) = [x for x in footnotes(out) if x.startswith("- x: paired by seed")]
    assert "KL: n = 2 (seeds 1, 2; seed 3 left out: nan), t(0.975, 1) = 12.706" in line
    rc, out, _ = vs_base(capsys, nan_runs, "--format", "json")
    kl = next(r for r in json.loads(out)["rows"] if r["label"] == "x")["difference"]["kl"]
    assert (kl["n"], kl["df"], kl["seeds"]) == (2, 1, [1, 2])
    assert (kl["lo"], kl["hi"]) == (pytest.approx(2 - half), pytest.approx(2 + half))


def test_a_seed_that_lacks_a_metric_gives_its_cell_n_2_and_t_for_1_df(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "m", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)
    edit(tmp_path, "m", 1, test__mi_dataset=2.25)
    edit(tmp_path, "m", 2, test__mi_dataset=3.25)  # d = 1, 2 against the baseline's 1.25
    edit(tmp_path, "m", 3, test__mi_dataset=None)  # seed 3 was tested before MI(dataset) existed
    rc, out, err = vs_base(capsys, tmp_path)
    assert rc == 0, err
    half = 12.706 * statistics.stdev([1.0, 2.0]) / math.sqrt(2)  # 6.353
    assert md_rows(out)["m"][6] == f"+1.50 [{1.5 - half:+.2f}, {1.5 + half:+.2f}] (n=2)" == "+1.50 [-4.85, +7.85] (n=2)"
    (line,) = [x for x in footnotes(out) if x.startswith("- m: paired by seed")]
    assert line.startswith("- m: paired by seed with base, seeds 1, 2, 3 (n = 3, t(0.975, 2) = 4.303)")
    assert "MI(dataset): n = 2 (seeds 1, 2; seed 3 left out: missing), t(0.975, 1) = 12.706" in line
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    d = next(r for r in json.loads(out)["rows"] if r["label"] == "m")["difference"]["mi_dataset"]
    assert (d["n"], d["df"], d["seeds"], d["excludes_zero"]) == (2, 1, [1, 2], False)
    assert d["hi"] == pytest.approx(1.5 + T1 * statistics.stdev([1.0, 2.0]) / math.sqrt(2))


def test_a_degenerate_difference_reads_as_every_seed_not_as_a_known_effect(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "wide", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=64)
    for seed in (1, 2, 3):
        edit(tmp_path, "wide", seed, test__au=36.0, test__kl=2.5)  # AU 36 vs 4, KL 2.5 vs 2.0 on every seed
    rc, out, _ = vs_base(capsys, tmp_path)
    assert rc == 0
    cells = md_rows(out)["wide"]
    assert cells[7] == "+32 on every seed (3/3)" and cells[4] == "+0.50 on every seed (3/3)"  # no interval, no star
    assert cells[5] == "+0.00 on every seed (3/3)"  # MI: seed/100 on both sides
    assert any("AU is a count" in x for x in footnotes(out))
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    au = next(r for r in json.loads(out)["rows"] if r["label"] == "wide")["difference"]["au"]
    assert (au["diff"], au["degenerate"], au["excludes_zero"], au["seeds_needed"]) == (32.0, True, None, None)


def test_by_text_intervals_are_one_checkpoints_and_carry_no_star_when_seeds_exist(tmp_path, capsys):
    a, b = text_pair(tmp_path)
    rc, out, _ = run_compare(capsys, b, "--baseline", a)
    cells = md_rows(out)["latent_dim=16"]
    assert cells[:3] == ["1", "text (seed 1's checkpoint), n=5", "+1.25 [+0.22, +2.28]*"]  # one run a side: its star
    # a row of two seeds against one baseline run: by text on seed 1's checkpoint, and no star
    b2 = make_run(tmp_path, "b", 2, metrics(103.0, 60.0), latent_dim=16)  # no baseline run of seed 2
    rc, out, _ = run_compare(capsys, b, b2, "--baseline", a)
    cells = md_rows(out)["latent_dim=16"]
    assert cells[:4] == ["2", "text (seed 1's checkpoint), n=5", "+1.25 [+0.22, +2.28]", "+3.00 [+1.04, +4.96]"]
    assert any("one checkpoint's texts" in x and "by-seed" in x for x in footnotes(out))


def test_mixed_k_is_not_differenced_on_iw_nll_unless_allowed(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "k100", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)
    for seed in (1, 2, 3):
        edit(tmp_path, "base", seed, iw_samples=500)
        edit(tmp_path, "k100", seed, iw_samples=100)
    rc, out, _ = vs_base(capsys, tmp_path)
    assert rc == 0
    cells = md_rows(out)["k100"]
    assert cells[2] == "– (K 100 vs 500)" and cells[-1] == "– (K 100 vs 500)"  # IW-NLL and PPL
    assert cells[3] == "+2.00 [-0.48, +4.48]"  # −ELBO does not depend on K
    (line,) = [x for x in footnotes(out) if x.startswith("- k100: ") and "seeds needed" not in x]
    assert "IW-NLL and PPL not differenced: K = 100 vs 500 importance samples" in line
    assert "finite-K bias" in line and "--allow-mixed-k" in line
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    d = next(r for r in json.loads(out)["rows"] if r["label"] == "k100")["difference"]["iw_nll"]
    assert d["diff"] is None and d["lo"] is None and "K 100 vs 500" in d["why"]
    rc, out, _ = vs_base(capsys, tmp_path, "--allow-mixed-k")
    assert rc == 0 and md_rows(out)["k100"][2] == "+2.00 [-0.48, +4.48]"
    (line,) = [x for x in footnotes(out) if x.startswith("- k100: ") and "seeds needed" not in x]
    assert "IW-NLL with different K (100 vs 500 importance samples" in line and "--allow-mixed-k" in line


def test_other_texts_are_not_differenced_on_iw_nll_unless_allowed(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    set_texts(tmp_path, "base", {1: "a" * 64, 2: "a" * 64, 3: "a" * 64})
    diff_runs(tmp_path, "other", {1: 115.0, 2: 117.0, 3: 120.0}, latent_dim=32)
    set_texts(tmp_path, "other", {1: "b" * 64, 2: "b" * 64, 3: "b" * 64})
    rc, out, _ = vs_base(capsys, tmp_path)
    # no mean over test texts (IW-NLL, −ELBO, KL, PPL) is differenced across texts (issue 45); MI, AU are
    assert md_rows(out)["other"][:6] == ["3", "–", "– (other texts)", "– (other texts)", "– (other texts)", "+0.00 (n/a)"]
    assert md_rows(out)["other"][8] == "– (other texts)"
    rc, out, _ = vs_base(capsys, tmp_path, "--allow-mixed-k")
    assert md_rows(out)["other"][:4] == ["3", "–", "+16.00 (n/a)", "+16.00 (n/a)"]


def test_seeds_needed_on_constructed_numbers():
    # d = 2, s = 1: n = 2: 12.706/√2 = 8.98; n = 3: 4.303/√3 = 2.48; n = 4: 3.182/2 = 1.59 < 2
    assert compare.seeds_needed(2.0, 1.0) == 4 and compare.seeds_needed(-2.0, 1.0) == 4
    # d = 0.5, s = 1: n = 17: t(16)/√17 = 2.1199/4.1231 = 0.5142 > 0.5; n = 18: 2.1098/4.2426 = 0.4973
    assert compare.seeds_needed(0.5, 1.0) == 18
    assert compare.seeds_needed(9.0, 1.0) == 2  # 8.98 < 9
    assert compare.seeds_needed(0.0, 1.0) is None and compare.seeds_needed(1.0, 0.0) is None


def test_seeds_needed_in_the_output_and_json(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "a", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)  # d = 2, 3, 1: mean 2, s.d. 1
    rc, out, _ = vs_base(capsys, tmp_path, "--resolve", "0.5")
    assert rc == 0
    (line,) = [x for x in footnotes(out) if x.startswith("- a: seeds needed")]
    assert line == "- a: seeds needed: IW-NLL 4, −ELBO 4; for a difference of 0.5: IW-NLL 18, −ELBO 18"
    assert f"- {compare.SEEDS_NOTE}" in footnotes(out) and "planning estimate" in compare.SEEDS_NOTE
    rc, out, _ = vs_base(capsys, tmp_path)  # without --resolve too (issue 50): the observed difference's
    assert [x for x in footnotes(out) if "seeds needed" in x] == [
        "- seeds needed for a 95% interval by seed of the IW-NLL difference to exclude 0, at the observed difference and "
        "paired s.d. (a planning estimate, not a power calculation; every metric's: --format json or --resolve X): a 4"]
    rc, out, _ = vs_base(capsys, tmp_path, "--resolve", "0.5", "--format", "json")
    doc = json.loads(out)
    d = next(r for r in doc["rows"] if r["label"] == "a")["difference"]
    assert (d["iw_nll"]["seeds_needed"], d["iw_nll"]["seeds_needed_resolve"]) == (4, 18)
    assert d["mi"]["seeds_needed"] is None  # degenerate (0 on every seed): no s.d. to plan with
    assert doc["resolve"] == 0.5
    assert T2 * 1.0 / math.sqrt(3) > 2 > 3.182446305 / 2  # 3 seeds do not resolve it, 4 would


# ---------------------------------------------------------------- issue 45 (9): labels, empty directories


def test_labels_name_a_strategy_and_its_arguments_once_and_the_lm_as_lm(tmp_path, capsys):
    freebits = {"class_path": "seqvae.FreeBits", "init_args": {"target": 8.0}}
    cosine = [{"class_path": "seqvae.CosineDispersion", "init_args": {"weight": 1.0}}]
    make_run(tmp_path, "last", 1, metrics(100.0, 60.0), pooling="last", kl_penalty=None, regularizers=None)
    make_run(tmp_path, "last2", 2, metrics(100.0, 60.0), pooling="last", kl_penalty=None, regularizers=None)
    make_run(tmp_path, "freebits", 1, metrics(99.0, 60.0), pooling="last", kl_penalty=freebits, regularizers=None)
    make_run(tmp_path, "cosine", 1, metrics(98.0, 60.0), pooling="last", kl_penalty=None, regularizers=cosine)
    make_run(tmp_path, "lm", 1, metrics(97.0, 60.0), pooling="last", latent_dim=0, kl_penalty=None, regularizers=None)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", "json")
    assert rc == 0
    labels = sorted(r["label"] for r in json.loads(out)["rows"])
    assert labels == ["LM", "common settings", "kl_penalty=FreeBits(target=8)", "regularizers=CosineDispersion(weight=1)"]


def test_label_dir_tells_apart_configs_in_one_directory(tmp_path, capsys):
    for version, k in enumerate((1, 10, 100, 1000)):  # `seqvae test` K scan: runs/kscan/version_N
        run = make_run(tmp_path, "kscan", 1, metrics(115.0 - version, 60.0), test_iw_samples=k)
        run.rename(run.parent / f"version_{version}")
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/kscan/version_*", "--label", "dir", "--format", "json")
    assert rc == 0
    labels = [r["label"] for r in json.loads(out)["rows"]]
    assert labels == [f"kscan: test_iw_samples={k}" for k in (1, 10, 100, 1000)]


def test_a_glob_skips_empty_and_failed_directories_with_a_note(tmp_path, capsys):
    diff_runs(tmp_path, "max", {1: 100.0, 2: 102.0}, latent_dim=8)
    (tmp_path / "yahoo" / "max" / "seed3").mkdir()  # empty
    (tmp_path / "yahoo" / "max" / "failed-seed4").mkdir()  # what a sweep leaves of a failed cell
    (tmp_path / "yahoo" / "max" / "failed-seed4" / "sweep.log").write_text("Traceback ...\n")
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/max/*", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["rows"][0]["n"] == 2
    assert err.startswith("seqvae compare: skipped 2 directories without metrics.json (predict, unfinished, failed or empty): ")
    assert "failed-seed4" in err and "seed3" in err
    rc, _, err = run_compare(capsys, tmp_path / "yahoo" / "max" / "seed3")  # named on its own: still refused
    assert rc == 2 and "not a run directory (no config.yaml or metrics.json)" in err


# ---------------------------------------------------------------- issue 45 (5): re-tests


def retest_of(trained: Path, where: Path, **model) -> Path:
    """What `seqvae test --ckpt_path <trained>/checkpoints/best.ckpt` writes: the model's settings as the
    checkpoint saved them, the test command's defaults for the rest, metrics.json naming the checkpoint."""
    config = yaml.safe_load((trained / "config.yaml").read_text())
    config["checkpoint"]["monitor"] = "val/loss"  # the command's defaults, not how the checkpoint was trained
    config["plateau"]["patience"] = 2
    config["data"]["max_vocab"] = None
    config["model"].update(model)
    config["ckpt_path"] = str(trained / "checkpoints" / "best.ckpt")
    where.mkdir(parents=True)
    (where / "config.yaml").write_text(yaml.safe_dump(config))
    m = {k: v for k, v in json.loads((trained / "metrics.json").read_text()).items() if k != "fit_seconds"}
    (where / "metrics.json").write_text(json.dumps(m | {"checkpoint": config["ckpt_path"], "test/iw_nll": 90.0}))
    return where


def trained_run(root: Path, variant: str, **model) -> Path:
    run = make_run(root, variant, 1, metrics(100.0, 60.0), **model)
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["checkpoint"]["monitor"], config["plateau"]["patience"], config["data"]["max_vocab"] = "val/elbo", 5, 20000
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    return run


def test_a_retest_is_labelled_by_its_checkpoints_training_settings(tmp_path, capsys):
    last = trained_run(tmp_path, "last", pooling="last")
    trained_max = trained_run(tmp_path, "max", pooling="max")
    retest = retest_of(trained_max, tmp_path / "retests" / "max_k1000", test_iw_samples=1000)
    rc, out, _ = run_compare(capsys, last, retest, "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert [r["label"] for r in doc["rows"]] == ["pooling=last", "pooling=max, test_iw_samples=1000"]
    assert doc["rows"][1]["runs"][0]["retest"] == {"checkpoint": str(trained_max / "checkpoints" / "best.ckpt"),
                                                   "training_run": str(trained_max)}  # fmt: skip
    head = "Re-tests (seqvae test --ckpt_path), grouped and labelled by their checkpoint's"
    assert any(w.startswith(head) for w in doc["warnings"])
    # the training run is not here (another machine's path): the model's settings and the test's own only
    shutil.rmtree(trained_max)
    rc, out, _ = run_compare(capsys, last, retest, "--format", "json")
    doc = json.loads(out)
    labels = ["pooling=last", "pooling=max, test_iw_samples=1000, re-test, training run not found"]
    assert [r["label"] for r in doc["rows"]] == labels
    assert any(w.startswith("Re-tests whose checkpoint's training run is not here") for w in doc["warnings"])


# ---------------------------------------------------------------- issue 45 (6): torch thread counts


def set_threads(root: Path, variant: str, threads: dict[int, int]) -> None:
    for seed, n in threads.items():
        path = root / "yahoo" / variant / f"seed{seed}" / "metrics.json"
        m = json.loads(path.read_text())
        m["provenance"]["torch_threads"] = n
        path.write_text(json.dumps(m))


def test_rows_and_differences_that_mix_thread_counts_are_marked(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    set_threads(tmp_path, "base", {1: 1, 2: 1, 3: 1})
    diff_runs(tmp_path, "two", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)
    set_threads(tmp_path, "two", {1: 2, 2: 2, 3: 2})
    diff_runs(tmp_path, "mixed", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=32)
    set_threads(tmp_path, "mixed", {1: 1, 2: 2, 3: 1})
    diff_runs(tmp_path, "one", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=64)
    set_threads(tmp_path, "one", {1: 1, 2: 1, 3: 1})
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    assert rc == 0
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1] for line in out.splitlines()[2:6]}
    assert rows == {"base": "3", "mixed": "3‡", "one": "3", "two": "3"}
    assert "- ‡ mixed: its runs used different torch thread counts (1 ×2, 2 ×1 runs); results depend on the thread" in out
    rc, out, _ = vs_base(capsys, tmp_path)
    assert [md_rows(out)[k][0] for k in ("base (baseline)", "mixed", "one", "two")] == ["3", "3‡", "3", "3‡"]
    assert ("- ‡ two: the difference to base mixes torch thread counts (rows two 2 ×3; baseline 1 ×3)") in out
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    rows = {r["label"]: r for r in json.loads(out)["rows"]}
    assert rows["mixed"]["torch_threads"] == [1, 2] and rows["two"]["difference_mixes_threads"] is True
    assert rows["one"]["difference_mixes_threads"] is False


# ---------------------------------------------------------------- issue 50 (5): runs without provenance


def test_runs_without_provenance_are_named_under_the_table(tmp_path, capsys):
    diff_runs(tmp_path, "a", {1: 100.0, 2: 101.0}, latent_dim=8)
    diff_runs(tmp_path, "b", {1: 100.0, 2: 101.0}, latent_dim=16)
    for variant, seed in (("a", 1), ("a", 2), ("b", 2)):  # from before provenance and seeds were recorded
        edit(tmp_path, variant, seed, provenance=None)
    edit(tmp_path, "b", 1, provenance=None, seeds={"seed_everything": 1})  # seeds recorded: its provenance is partial, not none
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    head = ("- No provenance (metrics.json records no git commit and no seeds: the code and seeds that made them are not "
            "in their files): ")
    assert rc == 0 and [x for x in footnotes(out) if x.startswith(head)] == [head + "a; b (seed2)"]
    edit(tmp_path, "b", 1, seeds=None)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    assert [x for x in footnotes(out) if x.startswith(head)] == [head + "every run"]


def test_a_huge_value_is_written_in_scientific_notation_in_every_cell():
    from seqvae.analysis.table_cells import diff_cell, stat_cell

    assert stat_cell({"mean": 1.1048697728e28, "std": 2.5e27}, 1) == "1.105e+28 ± 2.500e+27"
    assert stat_cell({"mean": 9_999_999.0, "std": None}, 1) == "9999999.0"  # below 1e7: as before
    assert stat_cell({"mean": 121.17, "std": 0.5}, 1) == "121.2 ± 0.5"
    d = {"diff": 1.2e28, "lo": -3e27, "hi": 2.7e28, "n": 3, "by": "seed"}
    assert diff_cell(d, 1) == "+1.200e+28 [-3.000e+27, +2.700e+28]"
