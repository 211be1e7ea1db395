"""`seqvae compare`, on fake run directories (config.yaml + metrics.json + curves.csv); no training."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
import yaml

from seqvae import commands as cli
from seqvae.analysis import compare

BASE = {
    "seed_everything": 1,
    "trainer": {
        "max_epochs": 20,
        "default_root_dir": None,
        "logger": {"class_path": "pytorch_lightning.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs/x"}},
    },
    "model": {
        "pooling": "max",
        "latent_dim": 32,
        "init": "reference",
        "bn_eps": 1e-5,
        "kl_schedule": {"class_path": "seqvae.LinearKLWarmup", "init_args": {"start": 0.1, "warmup_epochs": 10.0}},
    },
    "data": {"batch_size": 32, "seed": 0},
    "checkpoint": {"dirpath": None, "monitor": "val/loss", "filename": "best"},
    "plateau": {"monitor": "val/loss", "patience": 2},
    "ckpt_path": None,
}


def make_run(
    root: Path, variant: str, seed: int, metrics: dict, curves: list[dict] | None = None, drop: tuple = (), **model
) -> Path:
    """docs/results/<dataset>/<variant>/seed<N>/ layout; everything that names the run differs by seed.
    `drop`: model keys the run's config.yaml lacks (written before they existed)."""
    run = root / "yahoo" / variant / f"seed{seed}"
    run.mkdir(parents=True)
    config = copy.deepcopy(BASE)
    config["seed_everything"] = seed
    config["data"]["seed"] = seed
    config["trainer"]["logger"]["init_args"].update(name=variant, version=f"seed{seed}")
    config["checkpoint"]["dirpath"] = str(run / "checkpoints")
    config["model"].update(model)
    for key in drop:
        del config["model"][key]
    (run / "config.yaml").write_text("# pytorch_lightning==2.6.6\n" + yaml.safe_dump(config))
    (run / "metrics.json").write_text(json.dumps(metrics))
    if curves is not None:
        with open(run / "curves.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(curves[0]))
            writer.writeheader()
            writer.writerows(curves)
    return run


COMMIT = "c0ffee" + "0" * 34


def metrics(iw_nll: float, fit_seconds: float, old: bool = False) -> dict:
    m = {
        "test/iw_nll": iw_nll,
        "test/loss": iw_nll + 3,
        "test/kl": 2.0,
        "test/mi": 1.5,
        "test/mi_dataset": 1.25,
        "test/au": 4.0,
        "test/feature_cos": 0.5,
        "test/feature_ev1": 0.5 + iw_nll / 1000,
        "test/feature_ev3": 0.9,
        "test/feature_erank": 2.5,
        "test/mu_erank": 7.0,
        "test/iw_ppl": 110.0,
        "updates": 1000,
        "encoder_updates": 1500,
        "decoder_updates": 1000,
        "fit_seconds": fit_seconds,
        "provenance": {"git_commit": COMMIT, "git_dirty": False, "torch": "2.13.0"},
    }
    if old:  # written before the MI(dataset) and spectrum metrics and the update counters existed
        for key in ("test/mi_dataset", "encoder_updates", "decoder_updates", "test/feature_ev1", "test/feature_ev3",
                    "test/feature_erank", "test/mu_erank"):  # fmt: skip
            del m[key]
    return m


def curves(seed: int) -> list[dict]:
    return [
        {
            "step": 100 * (e + 1),
            "epoch": e,
            "val/kl": 1.0 + e + seed,
            "val/mi": 0.5,
            "val/au": 2,
            "val/feature_cos": 0.9,
            "val/loss": 50 - e,
        }
        for e in range(3)
    ]


@pytest.fixture
def runs(tmp_path):
    """Two groups: pooling=max over seeds 1-3, pooling=last (older metrics) over seeds 1-2."""
    root = tmp_path / "results"
    for seed, nll, secs in [(1, 100.0, 600.0), (2, 102.0, 1200.0), (3, 104.0, 1800.0)]:
        make_run(root, "max", seed, metrics(nll, secs), curves(seed), pooling="max")
    for seed, nll, secs in [(1, 90.0, 300.0), (2, 91.0, 300.0)]:
        make_run(root, "last", seed, metrics(nll, secs, old=True), curves(seed), pooling="last")
    return root


def run_compare(capsys, *argv) -> tuple[int, str, str]:
    rc = compare.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_json_groups_by_seed_with_exact_stats(runs, capsys):
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--format", "json")
    assert rc == 0
    rows = {r["label"]: r for r in json.loads(out)["rows"]}
    assert set(rows) == {"pooling=max", "pooling=last"}
    mx, last = rows["pooling=max"], rows["pooling=last"]
    assert (mx["n"], last["n"]) == (3, 2)
    assert [Path(r["path"]).name for r in mx["runs"]] == ["seed1", "seed2", "seed3"]
    assert [r["seed"] for r in mx["runs"]] == [1, 2, 3] and mx["baseline"] is False and "difference" not in mx
    assert mx["iw_nll"] == {"mean": 102.0, "std": 2.0}
    assert mx["neg_elbo"] == {"mean": 105.0, "std": 2.0}
    assert mx["train_minutes"] == {"mean": 20.0, "std": 10.0}
    assert mx["kl"] == {"mean": 2.0, "std": 0.0}
    assert mx["encoder_updates"]["mean"] == 1500.0
    assert last["iw_nll"] == {"mean": 90.5, "std": pytest.approx(0.5**0.5)}
    assert last["mi_dataset"] == {"mean": None, "std": None}
    assert last["decoder_updates"] == {"mean": None, "std": None}


def test_encoder_init_path_of_each_seed_does_not_split_the_group(tmp_path, capsys):
    for seed in (1, 2):
        ckpt = f"runs/yahoo10k/autoencoder/seed{seed}/checkpoints/best.ckpt"
        make_run(tmp_path, "freebits", seed, metrics(100.0 + seed, 60.0), pooling="last", init_encoder_from=ckpt)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", "json")
    assert rc == 0
    (row,) = json.loads(out)["rows"]
    assert row["n"] == 2 and row["iw_nll"]["mean"] == 101.5


def test_two_runs_of_one_config_and_seed_are_named_in_a_note(runs, capsys):
    twin = runs / "yahoo" / "max" / "seed1_resumed"
    shutil.copytree(runs / "yahoo" / "max" / "seed1", twin)
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/max/seed*", "--format", "json")
    (row,) = json.loads(out)["rows"]
    assert rc == 0 and row["n"] == 4
    (note,) = [w for w in json.loads(out)["warnings"] if "runs with seed" in w]
    assert note.startswith(f"max: 2 runs with seed 1 ({runs / 'yahoo' / 'max' / 'seed1'}, {twin}):")
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/*/seed?", "--format", "json")  # one run per seed: no such note
    assert not [w for w in json.loads(out)["warnings"] if "runs with seed" in w]


def test_single_run_has_no_std(runs, capsys):
    rc, out, _ = run_compare(capsys, runs / "yahoo" / "max" / "seed2", "--format", "json")
    assert rc == 0
    (row,) = json.loads(out)["rows"]
    assert row["n"] == 1 and row["iw_nll"] == {"mean": 102.0, "std": None}
    assert row["label"] == "max"  # nothing varies: the run directory's parent


def test_markdown_through_the_cli(runs, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["compare", f"{runs}/yahoo/*/seed*"])
    assert exit_.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| run | n | IW-NLL | −ELBO |") and "train minutes" in lines[0]
    assert set(lines[1]) == {"|", "-"}
    assert len(lines) == 2 + 2  # header, rule, one row per group
    rows = {line.split(" | ")[0].strip("| "): line for line in lines[2:]}
    assert "| 3 | 102.00 ± 2.00 | 105.00 ± 2.00 |" in rows["pooling=max"]
    assert "| 1500 ± 0 / 1000 ± 0 | 20.0 ± 10.0 |" in rows["pooling=max"]
    last = [c.strip() for c in rows["pooling=last"].strip("|").split("|")]
    assert last[1] == "2" and last[6] == "–"  # MI(dataset) is missing from the older runs
    assert last[-2] == "– / –" and last[-1] == "5.0 ± 0.0"


def test_spectrum_columns_blank_for_older_runs(runs, capsys):
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--format", "json")
    rows = {r["label"]: r for r in json.loads(out)["rows"]}
    assert rows["pooling=max"]["feature_ev1"] == {"mean": pytest.approx(0.602), "std": pytest.approx(0.002)}
    assert rows["pooling=max"]["mu_erank"] == {"mean": 7.0, "std": 0.0}
    assert rows["pooling=last"]["feature_erank"] == {"mean": None, "std": None}
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/*/seed*")
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = {line.split(" | ")[0].strip("| "): [c.strip() for c in line.strip("|").split("|")] for line in lines[2:]}
    col = headers.index("feature EV1")
    assert headers[col : col + 4] == ["feature EV1", "feature EV3", "feature erank", "μ erank"]
    assert cells["pooling=max"][col : col + 4] == ["0.602 ± 0.002", "0.900 ± 0.000", "2.5 ± 0.0", "7.0 ± 0.0"]
    assert cells["pooling=last"][col : col + 4] == ["–"] * 4


def test_csv_header_and_numbers(runs, capsys):
    rc, out, _ = run_compare(capsys, f"{runs}/yahoo/max/seed*", f"{runs}/yahoo/last/seed*", "--format", "csv")
    assert rc == 0
    table = list(csv.reader(io.StringIO(out)))
    assert table[0][:4] == ["label", "n", "iw_nll_mean", "iw_nll_std"]
    assert table[0][-2:] == ["train_minutes_mean", "train_minutes_std"]
    assert len(table[0]) == 2 + 2 * len(compare.METRICS)
    rows = {r[0]: dict(zip(table[0], r)) for r in table[1:]}
    assert rows["pooling=max"]["n"] == "3" and float(rows["pooling=max"]["iw_nll_std"]) == 2.0
    assert rows["pooling=last"]["mi_dataset_mean"] == ""


def test_labels_name_every_varying_key(tmp_path, capsys):
    schedule = {"class_path": "seqvae.CyclicalKL", "init_args": {"cycles": 4}}
    make_run(tmp_path, "a", 1, metrics(1.0, 60.0), latent_dim=16)
    make_run(tmp_path, "b", 1, metrics(2.0, 60.0), latent_dim=32, kl_schedule=schedule)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed1", "--format", "json")
    assert rc == 0
    assert [r["label"] for r in json.loads(out)["rows"]] == [
        "kl_schedule=LinearKLWarmup(start=0.1, warmup_epochs=10), latent_dim=16",
        "kl_schedule=CyclicalKL(cycles=4), latent_dim=32",
    ]


def test_labels_name_only_where_a_row_departs_from_most_rows(tmp_path, capsys):
    schedule = {"class_path": "seqvae.CyclicalKL", "init_args": {"cycles": 4}}
    make_run(tmp_path, "base", 1, metrics(1.0, 60.0))
    make_run(tmp_path, "last", 1, metrics(2.0, 60.0), pooling="last")
    make_run(tmp_path, "cyc", 1, metrics(3.0, 60.0), kl_schedule=schedule)
    make_run(tmp_path, "small", 1, metrics(4.0, 60.0), latent_dim=16)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed1")
    assert rc == 0
    labels = [line.split(" | ")[0].strip("| ") for line in out.splitlines()[2:6]]
    assert labels == ["common settings", "kl_schedule=CyclicalKL(cycles=4)", "pooling=last", "latent_dim=16"]
    note = out.splitlines()[7]
    assert note == (
        "- Rows are labelled by where they differ from the settings most rows share (common settings): "
        "kl_schedule=LinearKLWarmup(start=0.1, warmup_epochs=10), latent_dim=32, pooling=max"
    )


def test_short_names_disambiguate():
    names = compare.short_names(["checkpoint.monitor", "plateau.monitor", "model.pooling", "trainer.callbacks.0.class_path"])
    assert names == {
        "checkpoint.monitor": "checkpoint.monitor",
        "plateau.monitor": "plateau.monitor",
        "model.pooling": "pooling",
        "trainer.callbacks.0.class_path": "callbacks.0",
    }


def test_errors_are_one_line(tmp_path, runs, capsys):
    rc, out, err = run_compare(capsys, f"{tmp_path}/nothing/*")
    assert rc == 2 and out == ""
    assert err == f"seqvae compare: error: no run directories match '{tmp_path}/nothing/*'\n"
    (runs / "yahoo" / "max" / "seed2" / "metrics.json").unlink()
    rc, _, err = run_compare(capsys, runs / "yahoo" / "max" / "seed2")  # named: an error
    assert rc == 2 and err.startswith("seqvae compare: error: ") and "no metrics.json" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["compare", str(runs / "yahoo")])
    assert exit_.value.code == 2
    assert "not a run directory (no config.yaml or metrics.json)" in capsys.readouterr().err


def test_plots(runs, tmp_path, capsys):
    out_dir = tmp_path / "plots"
    rc, _, err = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--plots", out_dir)
    curves = ["val_au.png", "val_feature_cos.png", "val_kl.png", "val_loss.png", "val_mi.png"]
    assert rc == 0 and f"wrote 6 plots to {out_dir} ({', '.join(curves)}, final_test.png)" in err
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == sorted([*curves, "final_test.png"])
    assert all((out_dir / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


@pytest.mark.parametrize(
    "extra, says",
    [(["--resolve", "1.4"], "--resolve X: needs --baseline"),
     (["--resolve", "inf", "--baseline", "BASE"], "--resolve X: needs --baseline and a finite, non-zero X")],
)  # fmt: skip
def test_resolve_is_refused_where_it_would_say_nothing(runs, capsys, extra, says):
    # Before: ignored without --baseline (no line, exit 0); `inf` answered "none".
    extra = [e.replace("BASE", f"{runs}/yahoo/last/seed*") for e in extra]
    with pytest.raises(SystemExit) as done:
        compare.main([f"{runs}/yahoo/*/seed*", *extra])
    assert done.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].endswith(f"error: {says}")


def test_plots_under_a_file_is_refused_before_the_table(runs, tmp_path, capsys):
    # Before: the table printed, then a FileExistsError traceback.
    (tmp_path / "notes.txt").write_text("mine")
    for plots in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "plots"):
        rc, out, err = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--plots", plots)
        blocking = tmp_path / "notes.txt"
        assert rc == 2 and out == "" and err == f"seqvae compare: error: --plots {plots}: {blocking} is a file, not a directory\n"
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_plots_skipped_without_matplotlib(runs, tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    rc, out, err = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--plots", tmp_path / "plots")
    assert rc == 0 and out.count("\n") == 4
    assert err == "seqvae compare: plots skipped: matplotlib is not installed (pip install matplotlib)\n"
    assert not (tmp_path / "plots").exists()


def test_curve_legend_beside_the_axes_and_labels_wrapped(runs):
    from seqvae.analysis import plots

    groups = compare.group_runs(compare.find_runs([f"{runs}/yahoo/*/seed*"]))
    groups[0]["label"] = "kl_schedule=CyclicalKL, cycles=4, ratio=0.5, pooling=max, regularizers.0=CosineDispersion"
    curves = [[plots.read_curves(r["path"] / "curves.csv") for r in g["runs"]] for g in groups]
    fig = plots.curve_figure("val/kl", groups, curves)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    ax = fig.axes[0]
    legend, frame = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.x0 >= frame.x1  # entirely right of the plotting area: no curve is covered
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert max(len(line) for t in texts for line in t.split("\n")) <= plots.LABEL_WIDTH
    assert texts[0].replace("\n", " ") == f"{groups[0]['label']} (n={len(groups[0]['runs'])})"


def test_final_bar_chart_means_and_intervals(runs):
    """Bar lengths are the rows' means; error bars the 95% t-interval over seeds (none for one run)."""
    from seqvae.analysis import plots

    groups = compare.group_runs(compare.find_runs([f"{runs}/yahoo/max/seed*", f"{runs}/yahoo/last/seed*"]))
    assert [g["label"] for g in groups] == ["pooling=max", "pooling=last"]
    groups[1]["runs"] = groups[1]["runs"][:1]  # one run: a bar without an interval
    fig = plots.bar_figure(groups)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["IW-NLL", "KL", "MI(dataset)", "AU", "feature cos"]
    iw = fig.axes[0]
    widths = [p.get_width() for p in iw.patches]
    assert widths == [102.0, 90.0]  # max: seeds 100, 102, 104; last: seed 1 only
    from matplotlib.container import ErrorbarContainer

    (errorbars,) = [c for c in iw.containers if isinstance(c, ErrorbarContainer)]
    segments = errorbars.lines[2][0].get_segments()
    half = 2.0 * 4.302652729911275 / 3**0.5  # sd 2 over 3 seeds, t(0.975, 2)
    assert segments[0][:, 0].tolist() == pytest.approx([102.0 - half, 102.0 + half])
    assert segments[1][:, 0].tolist() == pytest.approx([90.0, 90.0])
    assert plots.mean_interval([1.0, 3.0]) == pytest.approx((2.0, 12.706204736174707 * 2**0.5 / 2**0.5))
    assert fig.axes[0].get_yticklabels()[0].get_text() == f"{groups[0]['label']} (n=3)"


def test_read_curves_mean_band(runs):
    c = compare.read_curves(runs / "yahoo" / "max" / "seed1" / "curves.csv")
    assert c["val/kl"] == {1.0: 2.0, 2.0: 3.0, 3.0: 4.0}
    assert "step" not in c and "epoch" not in c


def test_label_by_variant_directory(tmp_path):
    for variant, pooling in (("last", "last"), ("maxpool", "max")):
        for seed in (1, 2):
            make_run(tmp_path, variant, seed, metrics(400.0 + seed, 60.0), pooling=pooling)
    runs = compare.find_runs([str(tmp_path / "yahoo" / "*" / "seed*")])
    assert sorted(g["label"] for g in compare.group_runs(runs)) == ["pooling=last", "pooling=max"]
    by_dir = compare.group_runs(runs, "dir")
    assert sorted(g["label"] for g in by_dir) == ["last", "maxpool"]
    assert all(len(g["runs"]) == 2 and g["stats"]["iw_nll"]["mean"] == 401.5 for g in by_dir)


def test_runs_from_before_and_after_new_run_mechanics_keys_group_together(tmp_path):
    old = make_run(tmp_path, "max", 1, metrics(400.0, 60.0), drop=("init", "bn_eps"))
    new = make_run(tmp_path, "max", 2, metrics(402.0, 60.0))
    config = yaml.safe_load((new / "config.yaml").read_text())
    config["periodic_checkpoint"] = {"every_n_minutes": 10.0, "every_n_batches": None}
    config["model"]["generation"] = {"mode": "reconstruct", "decoding": "greedy"}
    config["trainer"]["use_distributed_sampler"] = False
    config["trainer"]["enable_progress_bar"] = True  # run in a terminal
    config["text_samples"] = {"n": 4, "max_length": 40}
    config["latent_dimensions"] = {"enabled": True}
    config["model"]["encoder_hidden_dim"] = None  # the newer key, at the value every older run had
    config.setdefault("plateau", {})["enabled"] = True  # the newer switch, at what every older run did
    (new / "config.yaml").write_text(yaml.safe_dump(config))
    groups = compare.group_runs(compare.find_runs([str(old), str(new)]))
    assert len(groups) == 1 and groups[0]["stats"]["iw_nll"]["mean"] == 401.0
    assert [n for n in compare.filled_in_notes(groups) if "encoder_hidden_dim" in n or "plateau" in n] == []
    off = make_run(tmp_path, "max_constant_lr", 1, metrics(399.0, 60.0))
    config = yaml.safe_load((off / "config.yaml").read_text())
    config.setdefault("plateau", {})["enabled"] = False
    (off / "config.yaml").write_text(yaml.safe_dump(config))
    groups = compare.group_runs(compare.find_runs([str(old), str(new), str(off)]))
    assert sorted(g["label"] for g in groups) == ["common settings", "enabled=false"]
    shutil.rmtree(off)
    make_run(tmp_path, "wide", 1, metrics(398.0, 60.0), encoder_hidden_dim=256)
    groups = compare.group_runs(compare.find_runs([str(tmp_path / "yahoo" / "*" / "seed*")]))
    assert sorted(g["label"] for g in groups) == ["common settings", "encoder_hidden_dim=256"]


def test_a_row_that_differs_from_the_common_settings_is_never_labelled_as_them(tmp_path):
    # encoder 128 from before model.encoder_hidden_dim existed, against two rows widened to 256:
    # the old row's null resolves to its hidden_dim, so its label says 128, not "common settings"
    make_run(tmp_path, "last", 1, metrics(400.0, 60.0), hidden_dim=128)
    make_run(tmp_path, "wide_last", 1, metrics(401.0, 60.0), hidden_dim=128, encoder_hidden_dim=256, pooling="last")
    make_run(tmp_path, "wide_max", 1, metrics(402.0, 60.0), hidden_dim=128, encoder_hidden_dim=256)
    make_run(tmp_path, "same", 2, metrics(403.0, 60.0), hidden_dim=128, encoder_hidden_dim=128)
    groups = compare.group_runs(compare.find_runs([str(tmp_path / "yahoo" / "*" / "seed*")]))
    labels = sorted((g["label"], len(g["runs"])) for g in groups)
    assert labels == [("common settings", 1), ("encoder_hidden_dim=128", 2), ("pooling=last", 1)]
    # a key most rows set and one row lacks (no default to fill in) is named as absent
    other = tmp_path / "other"
    for variant in ("a", "b"):
        make_run(other, variant, 1, metrics(400.0, 60.0), beta=0.5 if variant == "a" else 2.0, gamma=1)
    make_run(other, "old", 1, metrics(400.0, 60.0))
    groups = compare.group_runs(compare.find_runs([str(other / "yahoo" / "*" / "seed*")]))
    assert sorted(g["label"] for g in groups) == ["beta=0.5", "beta=2.0", "gamma=–"]


def test_label_by_dir_tells_apart_variants_of_one_name_in_two_grids(tmp_path):
    for grid, width in (("recipe20", None), ("encoder_width", 256)):
        for seed in (1, 2):
            make_run(tmp_path / grid, "last", seed, metrics(400.0 + seed, 60.0), encoder_hidden_dim=width, pooling="last")
    make_run(tmp_path / "encoder_width", "max", 1, metrics(405.0, 60.0), encoder_hidden_dim=256)
    runs = compare.find_runs([str(tmp_path / "*" / "yahoo" / "*" / "seed*")])
    assert sorted(g["label"] for g in compare.group_runs(runs, "dir")) == [
        "encoder_width/yahoo/last",
        "max",
        "recipe20/yahoo/last",
    ]


def test_runs_from_before_a_model_key_existed_group_with_its_default_only(tmp_path):
    old = make_run(tmp_path, "max", 1, metrics(400.0, 60.0), drop=("init",))  # written before model.init existed
    same = make_run(tmp_path, "max", 2, metrics(402.0, 60.0), init="reference")
    other = make_run(tmp_path, "maxinit", 3, metrics(390.0, 60.0), init="pytorch")
    groups = compare.group_runs(compare.find_runs([str(old), str(same), str(other)]))
    assert sorted((g["label"], len(g["runs"]), g["stats"]["iw_nll"]["mean"]) for g in groups) == [
        ("init=pytorch", 1, 390.0),
        ("init=reference", 2, 401.0),
    ]


def test_y_scale_decides_the_axis():
    assert compare.y_scale([0.07, 6.0, 156097.0]) == ("log", {})
    assert compare.y_scale([0.07, 6.0, 13.8]) == ("linear", {})  # collapsed vs not: still linear
    # zeros or negatives (the LM's KL, MI) cannot go on a log axis: symlog, linear up to the median magnitude
    assert compare.y_scale([0.0, 0.1, 0.5, 2.0, 156097.0]) == ("symlog", {"linthresh": 1.25})
    assert compare.y_scale([-0.02, 0.2, 5000.0]) == ("symlog", {"linthresh": 0.2})
    assert compare.y_scale([-0.02, 0.2, 5.0]) == ("linear", {})
    assert compare.y_scale([0.0, 0.0]) == ("linear", {}) and compare.y_scale([]) == ("linear", {})


# ---------------------------------------------------------------- --baseline: differences with 95% intervals

REPO = Path(__file__).resolve().parents[1]
T2, T3, T4 = 4.302652730, 3.182446305, 2.776445105  # t(0.975, df) for df 2, 3, 4 (any table)


def t_cdf_from_zero(q: float, df: int, steps: int = 4000) -> float:
    """P(0 < T < q) for Student's t with df degrees of freedom, by Simpson's rule on its density."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    h = q / steps
    weights = (1 if i in (0, steps) else 4 if i % 2 else 2 for i in range(steps + 1))
    return h / 3 * sum(w * c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i, w in enumerate(weights))


def test_t_quantiles_are_the_975_points():
    assert [round(compare.t975(df), 3) for df in (1, 2, 4, 10, 30)] == [12.706, 4.303, 2.776, 2.228, 2.042]
    assert [round(compare.t975(df), 3) for df in (40, 60, 120)] == [2.021, 2.000, 1.980]  # the expansion past the table
    assert compare.t975(10**6) == pytest.approx(statistics.NormalDist().inv_cdf(0.975), abs=1e-5)
    for df in [*range(1, 36), 50, 200, 1000]:
        assert t_cdf_from_zero(compare.t975(df), df) == pytest.approx(0.475, abs=1e-8), df
    assert compare.t975(2.9) == compare.t975(2)  # Welch's fractional df is rounded down
    with pytest.raises(ValueError):
        compare.t975(0.5)


def diff_runs(root: Path, variant: str, values: dict[int, float], **model) -> None:
    """One run per seed; IW-NLL given, −ELBO = IW-NLL + 3 + seed/10, MI = seed/100 (so they vary too)."""
    for seed, nll in values.items():
        m = metrics(nll, 60.0)
        m["test/loss"] = nll + 3 + seed / 10
        m["test/mi"] = seed / 100
        make_run(root, variant, seed, m, **model)


def vs_base(capsys, root: Path, *argv) -> tuple[int, str, str]:
    """compare every run under root, rows labelled by directory, against the runs of `base`."""
    return run_compare(capsys, f"{root}/yahoo/*/seed*", "--label", "dir", "--baseline", f"{root}/yahoo/base/seed*", *argv)


def md_rows(out: str) -> dict[str, list[str]]:
    """label -> cells (after label) of the markdown differences table."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("| ") and not line.startswith("| run "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_baseline_paired_by_seed(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "a", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)  # d = 2, 3, 1
    diff_runs(tmp_path, "b", {1: 105.0, 2: 107.0, 3: 110.0, 4: 1.0}, latent_dim=32)  # d = 5, 6, 7; seed 4 unpaired
    rc, out, err = vs_base(capsys, tmp_path)
    assert rc == 0 and err == ""
    rows = md_rows(out)
    assert list(rows) == ["base (baseline)", "a", "b"]
    headers = [c.strip() for c in next(x for x in out.splitlines() if x.startswith("| run ")).strip("|").split("|")]
    assert headers[:5] == ["run", "n", "paired by", "IW-NLL", "−ELBO"]
    half = T2 * 1.0 / math.sqrt(3)  # sd of (2, 3, 1) and of (5, 6, 7) is 1
    assert rows["a"][2] == f"+2.00 [{2 - half:+.2f}, {2 + half:+.2f}]"
    assert rows["a"][:3] == ["3", "seed, n=3", "+2.00 [-0.48, +4.48]"]
    assert rows["b"][:3] == ["4", "seed, n=3", "+6.00 [+3.52, +8.48]*"]  # excludes 0: marked
    assert rows["b"][3] == "+6.00 [+3.52, +8.48]*"  # −ELBO: the same seed-wise differences
    assert rows["a"][5] == "+0.00 on every seed (3/3)"  # MI: identical per seed; no interval of width 0, no mark
    assert rows["base (baseline)"][:4] == ["3", "–", "101.33 ± 1.53", "104.53 ± 1.63"]
    assert "- a: paired by seed with base, seeds 1, 2, 3 (n = 3, t(0.975, 2) = 4.303)" in out.splitlines()
    assert ("- b: paired by seed with base, seeds 1, 2, 3 (n = 3, t(0.975, 2) = 4.303); "
            "1 run(s) without a partner of the same seed left out") in out.splitlines()  # fmt: skip
    assert "\n\n| run | n | paired by |" in out and "|\n\n- a: " in out  # blank lines around the table
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    doc = json.loads(out)
    b = next(r for r in doc["rows"] if r["label"] == "b")
    assert b["difference"]["iw_nll"] == {"diff": 6.0, "lo": pytest.approx(6 - half), "hi": pytest.approx(6 + half), "n": 3,
                                         "df": 2, "by": "seed", "why": None, "mc_se": None, "excludes_zero": True,
                                         "seeds": [1, 2, 3], "degenerate": None, "seeds_needed": 3,
                                         "seeds_needed_resolve": None}  # fmt: skip
    a = next(r for r in doc["rows"] if r["label"] == "a")
    assert a["difference"]["iw_nll"]["excludes_zero"] is False and a["paired_by"] == "seed, n=3"
    assert doc["baseline"] == "base" and doc["rows"][0]["baseline"] is True and "difference" not in doc["rows"][0]


def write_per_text(run: Path, table: dict[str, list[float]], digest: str = "d1", order: list[int] | None = None) -> None:
    """per_text.csv (rows in `order`) and the metrics.json keys that name it."""
    n = len(table["neg_elbo"])
    with open(run / "per_text.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "line", "tokens", "neg_elbo", "kl", "iw_nll", "iw_se"])
        for i in order or range(n):
            writer.writerow([i, i + 1, 10, table["neg_elbo"][i], table["kl"][i], table["iw_nll"][i], "nan"])
    m = json.loads((run / "metrics.json").read_text())
    m.update(per_text_file="per_text.csv", test_texts_sha256=digest)
    (run / "metrics.json").write_text(json.dumps(m))


BASE_TEXTS = {
    "neg_elbo": [10.0, 20.0, 30.0, 40.0, 50.0],
    "kl": [1.0, 2.0, 3.0, 4.0, 5.0],
    "iw_nll": [9.0, 19.0, 29.0, 39.0, 49.0],
}
D_ELBO, D_KL, D_IW = [1.0, 2.0, 3.0, 4.0, 5.0], [-1.0, 1.0, 0.0, 2.0, -2.0], [0.5, 1.0, math.nan, 1.5, 2.0]


def text_pair(tmp_path: Path, digest_b: str = "d1") -> tuple[Path, Path]:
    """Two single runs (seed 1) of different configs with per-text files; b − a per text is D_*."""
    ma = metrics(100.0, 60.0) | {"test/mi_dataset": 0.30, "test/mi_dataset_se": 0.03, "iw_samples": 100}
    mb = metrics(102.0, 60.0) | {"test/mi_dataset": 0.70, "test/mi_dataset_se": 0.04, "iw_samples": 100}
    a = make_run(tmp_path, "a", 1, ma, latent_dim=8)
    b = make_run(tmp_path, "b", 1, mb, latent_dim=16)
    write_per_text(a, BASE_TEXTS)
    shifted = {k: [x + d for x, d in zip(BASE_TEXTS[k], dk)] for k, dk in (("neg_elbo", D_ELBO), ("kl", D_KL), ("iw_nll", D_IW))}
    write_per_text(b, shifted, digest=digest_b, order=[4, 2, 0, 3, 1])  # rows in another order: matched by index
    return a, b


def test_baseline_paired_by_text(tmp_path, capsys):
    a, b = text_pair(tmp_path)
    rc, out, err = run_compare(capsys, b, "--baseline", a, "--format", "json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert [r["label"] for r in doc["rows"]] == ["latent_dim=8", "latent_dim=16"]
    diff = doc["rows"][1]["difference"]
    # −ELBO: d = 1..5, mean 3, sd √2.5, t(0.975, 4)
    half = T4 * statistics.stdev(D_ELBO) / math.sqrt(5)
    assert diff["neg_elbo"] == {"diff": 3.0, "lo": pytest.approx(3 - half), "hi": pytest.approx(3 + half), "n": 5, "df": 4,
                                "by": "text", "why": None, "mc_se": None, "excludes_zero": True, "seeds": None,
                                "degenerate": None, "seeds_needed": None, "seeds_needed_resolve": None}  # fmt: skip
    half = T4 * statistics.stdev(D_KL) / math.sqrt(5)
    assert diff["kl"]["diff"] == pytest.approx(0.0) and diff["kl"]["hi"] == pytest.approx(half)
    assert diff["kl"]["excludes_zero"] is False
    # IW-NLL: the text whose value is nan is left out: n = 4, t(0.975, 3)
    d_iw = [x for x in D_IW if not math.isnan(x)]
    half = T3 * statistics.stdev(d_iw) / math.sqrt(4)
    assert diff["iw_nll"]["n"] == 4 and diff["iw_nll"]["diff"] == pytest.approx(1.25)
    assert (diff["iw_nll"]["lo"], diff["iw_nll"]["hi"]) == (pytest.approx(1.25 - half), pytest.approx(1.25 + half))
    # set-level metrics of one run per side: the difference, no interval; MC noise of MI(dataset) beside it
    assert diff["mi"] == {**dict.fromkeys(diff["mi"]), "diff": 0.0, "n": 1, "why": "one run per side"}
    assert diff["mi_dataset"]["diff"] == pytest.approx(0.4) and diff["mi_dataset"]["mc_se"] == pytest.approx(0.05)
    assert (diff["iw_ppl"]["diff"], diff["iw_ppl"]["lo"], diff["iw_ppl"]["why"]) == (0.0, None, "one run per side")
    assert doc["pairings"] == [
        "latent_dim=16: seed 1 vs latent_dim=8 seed 1: IW-NLL, −ELBO, KL paired by test text of seed 1's checkpoint "
        "(n = 5 texts, t(0.975, 4) = 2.776; IW-NLL on the 4 texts both have it for, t(0.975, 3) = 3.182); "
        "MI, MI(dataset), AU, PPL: n/a, one run per side",
        compare.BY_TEXT_NOTE,
    ]
    rc, out, _ = run_compare(capsys, b, "--baseline", a)
    cells = md_rows(out)["latent_dim=16"]
    assert cells[:5] == ["1", "text (seed 1's checkpoint), n=5", "+1.25 [+0.22, +2.28]*", "+3.00 [+1.04, +4.96]*",
                         "+0.00 [-1.96, +1.96]"]  # fmt: skip
    assert cells[5:7] == ["+0.00 (n/a)", "+0.40 (n/a; MC se 0.05)"]
    assert cells[-1] == "0.040"  # the row's own MI(dataset) MC se column


def test_by_text_falls_back_when_the_test_texts_differ(tmp_path, capsys):
    a, b = text_pair(tmp_path, digest_b="other")
    rc, out, err = run_compare(capsys, b, "--baseline", a)
    assert rc == 0 and err == ""
    cells = md_rows(out)["latent_dim=16"]
    # metrics.json values, named not comparable, with no Monte-Carlo s.e. that would read as their error
    # no mean over the test texts is differenced across other texts (IW-NLL: issue 35; −ELBO, KL: issue 45)
    assert cells[:5] == ["1", "one run each", "– (other texts)", "– (other texts)", "– (other texts)"]
    assert cells[5] == "+0.00 (not comparable)"  # MI
    assert not any("MC se" in c for c in cells[2:9])
    line = ("- latent_dim=16: seed 1 vs latent_dim=8 seed 1: not comparable (different test texts "
            "(test_texts_sha256 other… vs d1…)); difference of the two runs' values, no interval; "
            "IW-NLL, −ELBO, KL, PPL (means over texts) not differenced on other texts "
            "(--allow-mixed-k to difference them)")  # fmt: skip
    assert line in out.splitlines()
    # same digest but not the same rows, or a per-text file gone: also no pairing by text, said why
    write_per_text(b, {k: v[:4] for k, v in BASE_TEXTS.items()}, digest="d1")
    _, out, _ = run_compare(capsys, b, "--baseline", a)
    assert "not paired by text (the per-text files have different rows (4 vs 5 texts, 1 unmatched))" in out
    (a / "per_text.csv").unlink()
    _, out, _ = run_compare(capsys, b, "--baseline", a)
    assert f"not paired by text ({a / 'per_text.csv'} is missing)" in out


def test_malformed_per_text_file_is_an_error(tmp_path, capsys):
    a, b = text_pair(tmp_path)
    (b / "per_text.csv").write_text("index,line,tokens\n0,1,3\n")
    rc, out, err = run_compare(capsys, b, "--baseline", a)
    assert rc == 2 and out == ""
    expected = "expected index,line,tokens,neg_elbo,kl,iw_nll,iw_se"
    assert err == f"seqvae compare: error: {b / 'per_text.csv'}: no column neg_elbo, kl, iw_nll ({expected})\n"
    (b / "per_text.csv").write_text("index,line,tokens,neg_elbo,kl,iw_nll,iw_se\n0,1,3,1.0,0.5,nan,nan\n0,2,3,1.0,x,1,1\n")
    rc, out, err = run_compare(capsys, b, "--baseline", a)
    assert (rc, out) == (2, "") and err.startswith(f"seqvae compare: error: {b / 'per_text.csv'}:3: not a number in ")
    (b / "per_text.csv").write_text("index,line,tokens,neg_elbo,kl,iw_nll,iw_se\n0,1,3,1.0,0.5,nan,nan\n0,2,3,1.0,1,1,1\n")
    rc, out, err = run_compare(capsys, b, "--baseline", a)
    assert (rc, out) == (2, "") and err == f"seqvae compare: error: {b / 'per_text.csv'}:3: index 0 occurs twice\n"


def test_same_config_two_seeds_baseline_is_its_own_row(tmp_path, capsys):
    """`seqvae compare A B --baseline A` with A and B one config (seeds 1, 2): B against A, by text."""
    a = make_run(tmp_path, "max", 1, metrics(100.0, 60.0))
    b = make_run(tmp_path, "max", 2, metrics(101.0, 60.0))
    write_per_text(a, BASE_TEXTS)
    write_per_text(b, {k: [x + 1 for x in v] for k, v in BASE_TEXTS.items()})
    rc, out, _ = run_compare(capsys, a, b, "--baseline", a)
    assert rc == 0
    rows = md_rows(out)
    assert list(rows) == ["max (baseline)", "max"]
    assert rows["max"][:4] == ["1", "text (checkpoints seed 2 vs seed 1), n=5", "+1.00 on every text (5/5)",
                               "+1.00 on every text (5/5)"]  # fmt: skip
    assert ("- max: seed 2 vs max seed 1: IW-NLL, −ELBO, KL paired by test text of checkpoints seed 2 vs seed 1 "
            "(n = 5 texts, t(0.975, 4) = 2.776)") in out  # fmt: skip


def test_one_run_against_the_baseline_run_of_its_seed(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "one", {2: 110.0}, latent_dim=16)
    diff_runs(tmp_path, "orphan", {7: 90.0}, latent_dim=32)
    rc, out, _ = vs_base(capsys, tmp_path)
    rows = md_rows(out)
    assert rows["one"][:3] == ["1", "one run each", "+9.00 (n/a)"]  # 110 − 101 (seed 2), not − the mean 101.33
    assert rows["orphan"][:3] == ["1", "–", "-11.33 (n/a)"]  # no seed 7 in the baseline: difference of the means
    lines = out.splitlines()
    assert "- one: seed 2 vs base seed 2: not paired by text (" in "\n".join(lines)
    assert "- orphan: not paired: 1 run (seed 7) and no base run of the same seed; difference of the means, no interval" in lines


def test_unpaired_welch_when_no_seed_is_shared(tmp_path, capsys):
    base, other = {1: 100.0, 2: 101.0, 3: 103.0}, {4: 104.0, 5: 110.0, 6: 107.0, 7: 109.0}
    diff_runs(tmp_path, "base", base, latent_dim=8)
    diff_runs(tmp_path, "w", other, latent_dim=16)
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    doc = json.loads(out)
    d = doc["rows"][1]["difference"]["iw_nll"]
    a, b = list(other.values()), list(base.values())
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    df = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 2)
    assert 4 < df < 5  # so t(0.975, 4) by rounding down
    half = T4 * math.sqrt(va + vb)
    mean = statistics.fmean(a) - statistics.fmean(b)
    assert d == {"diff": pytest.approx(mean), "lo": pytest.approx(mean - half), "hi": pytest.approx(mean + half), "n": 7,
                 "df": 4, "by": "welch", "why": None, "mc_se": None, "excludes_zero": True, "seeds": None,
                 "degenerate": None, "seeds_needed": None, "seeds_needed_resolve": None}  # fmt: skip
    assert doc["pairings"] == ["w: not paired (no seed in common): unpaired Welch interval, 4 vs 3 runs (df rounded down)",
                               compare.DEGENERATE_NOTE]  # MI: seed/100 on both sides, s.d. 0 in each  # fmt: skip


def set_texts(root: Path, variant: str, digests: dict[int, str]) -> None:
    """Records test_texts_sha256 (seed -> digest) in the runs' metrics.json."""
    for seed, digest in digests.items():
        path = root / "yahoo" / variant / f"seed{seed}" / "metrics.json"
        path.write_text(json.dumps(json.loads(path.read_text()) | {"test_texts_sha256": digest}))


A64, B64 = "a" * 64, "b" * 64


def test_a_row_tested_on_different_texts_is_named(tmp_path, capsys):
    diff_runs(tmp_path, "max", {1: 139.0, 2: 143.0}, latent_dim=8)
    set_texts(tmp_path, "max", {1: A64, 2: B64})
    diff_runs(tmp_path, "last", {1: 120.0, 2: 121.0, 3: 122.0}, latent_dim=16)
    set_texts(tmp_path, "last", {1: A64, 2: A64})  # seed 3 from before the digest was recorded: no warning
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert lines[3].startswith("| max | 2 | 141.00 ± 2.83 |")
    assert lines[4:] == [
        "",
        "- max: its 2 runs were tested on 2 different sets of texts (test_texts_sha256 differ): its mean mixes test sets",
    ]
    diff_runs(tmp_path, "max", {3: 141.0}, latent_dim=8)  # one more run that does not record its texts
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir", "--format", "json")
    assert json.loads(out)["warnings"] == [
        "max: its 3 runs were tested on 2 different sets of texts (test_texts_sha256 differ; 1 run(s) do not record it): "
        "its mean mixes test sets"
    ]


def test_a_difference_to_runs_tested_on_other_texts_has_no_interval(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    set_texts(tmp_path, "base", {1: A64, 2: A64, 3: A64})
    diff_runs(tmp_path, "same", {1: 102.0, 2: 104.0, 3: 104.0}, latent_dim=16)  # d = 2, 3, 1 as in test_baseline_paired_by_seed
    set_texts(tmp_path, "same", {1: A64, 2: A64})  # seed 3 does not record its texts: taken as the same
    diff_runs(tmp_path, "other", {1: 115.0, 2: 117.0, 3: 120.0}, latent_dim=32)
    set_texts(tmp_path, "other", {1: B64, 2: B64, 3: B64})
    diff_runs(tmp_path, "welch", {4: 110.0, 5: 112.0}, latent_dim=64)  # no seed in common: would be Welch
    set_texts(tmp_path, "welch", {4: B64, 5: B64})
    rc, out, err = vs_base(capsys, tmp_path)
    assert rc == 0 and err == ""
    rows = md_rows(out)
    assert rows["same"][:3] == ["3", "seed, n=3", "+2.00 [-0.48, +4.48]"]
    assert rows["other"][:4] == ["3", "–", "– (other texts)", "– (other texts)"]  # not −ELBO 117.33 − 101.33 either
    assert rows["welch"][:3] == ["2", "–", "– (other texts)"]
    assert set(out.splitlines()) >= {
        "- other, welch: tested on different texts than the baseline: not comparable "
        "(test_texts_sha256 bbbbbbbbbbbb… vs aaaaaaaaaaaa…); difference of the means, no interval; "
        "IW-NLL, −ELBO, KL, PPL (means over texts) not differenced on other texts (--allow-mixed-k to difference them)",
        "- same: paired by seed with base, seeds 1, 2, 3 (n = 3, t(0.975, 2) = 4.303)",
    }
    rc, out, _ = vs_base(capsys, tmp_path, "--format", "json")
    other = next(r for r in json.loads(out)["rows"] if r["label"] == "other")
    refused = "other texts — not differenced: tested on different texts"
    assert other["paired_by"] == "–" and other["difference"]["neg_elbo"] == {**compare.DIFF_KEYS, "why": refused}
    assert other["difference"]["mi"] == {
        **compare.DIFF_KEYS, "diff": pytest.approx(0.0), "why": "tested on different texts than the baseline"
    }  # fmt: skip
    assert other["difference"]["iw_nll"] == {**compare.DIFF_KEYS, "why": refused}
    # a baseline whose own runs mix test sets: no difference to it has an interval, and the row is named
    set_texts(tmp_path, "base", {3: B64})
    rc, out, _ = vs_base(capsys, tmp_path)
    assert md_rows(out)["same"][:4] == ["3", "–", "– (other texts)", "– (other texts)"]
    refused = "; IW-NLL, −ELBO, KL, PPL (means over texts) not differenced on other texts (--allow-mixed-k to difference them)"
    assert out.splitlines()[-4:] == [
        "",
        "- other, welch: tested on different texts than the baseline: not comparable "
        "(test_texts_sha256 bbbbbbbbbbbb… vs aaaaaaaaaaaa…/bbbbbbbbbbbb…); difference of the means, no interval" + refused,
        "- same: tested on different texts than the baseline: not comparable "
        "(test_texts_sha256 aaaaaaaaaaaa… vs aaaaaaaaaaaa…/bbbbbbbbbbbb…); difference of the means, no interval" + refused,
        "- base: its 3 runs were tested on 2 different sets of texts (test_texts_sha256 differ): its mean mixes test sets",
    ]


def test_a_row_of_several_runs_against_one_baseline_run_names_the_runs_left_out(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0}, latent_dim=8)
    diff_runs(tmp_path, "max", {1: 102.0, 2: 110.0, 3: 111.0}, latent_dim=16)
    rc, out, err = vs_base(capsys, tmp_path)
    assert rc == 0 and err == ""
    assert md_rows(out)["max"][:3] == ["3", "one run each", "+2.00 (n/a)"]  # seed 1 against seed 1
    assert out.splitlines()[-1] == (
        f"- max: seed 1 vs base seed 1: not paired by text ({tmp_path}/yahoo/max/seed1 has no per-text file); "
        "one run per side: differences only, n/a; 2 run(s) without a partner of the same seed left out (seeds 2, 3)"
    )
    # different test texts are said before a missing per-text file
    set_texts(tmp_path, "base", {1: A64})
    set_texts(tmp_path, "max", {1: B64})
    rc, out, _ = vs_base(capsys, tmp_path)
    assert out.splitlines()[-1] == (
        "- max: seed 1 vs base seed 1: not comparable (different test texts (test_texts_sha256 bbbbbbbbbbbb… vs "
        "aaaaaaaaaaaa…)); difference of the two runs' values, no interval; 2 run(s) without a partner of the same seed "
        "left out (seeds 2, 3); IW-NLL, −ELBO, KL, PPL (means over texts) not differenced on other texts "
        "(--allow-mixed-k to difference them)"
    )
    # one run against a baseline of several: the baseline row shows all of them; the line is as before
    shutil.rmtree(tmp_path / "yahoo")
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "one", {2: 110.0}, latent_dim=16)
    rc, out, _ = vs_base(capsys, tmp_path)
    assert out.splitlines()[-1] == (
        f"- one: seed 2 vs base seed 2: not paired by text ({tmp_path}/yahoo/one/seed2 has no per-text file); "
        "one run per side: differences only, n/a"
    )


def test_commit_warning_is_one_line(tmp_path, capsys):
    def prov(commit, dirty=False):
        return {"git_commit": commit, "git_dirty": dirty}

    a1 = metrics(100.0, 60.0) | {"provenance": prov("a" * 40)}
    make_run(tmp_path, "a", 1, a1, latent_dim=8)
    make_run(tmp_path, "a", 2, a1, latent_dim=8)
    rc, _, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*")
    assert rc == 0 and err == ""  # one clean commit: nothing to say
    make_run(tmp_path, "b", 1, metrics(100.0, 60.0) | {"provenance": prov("b" * 40, dirty=True)}, latent_dim=16)
    no_prov = metrics(100.0, 60.0)
    del no_prov["provenance"]
    make_run(tmp_path, "c", 1, no_prov, latent_dim=32)
    warning = ("seqvae compare: warning: runs come from 3 commits (aaaaaaa ×2, bbbbbbb+dirty ×1, unknown ×1); "
               "unknown: metrics.json has no provenance; +dirty: with uncommitted changes\n")  # fmt: skip
    # the rows of runs without provenance (no commit, no seeds: issue 50) are named under the table
    note = ("No provenance (metrics.json records no git commit and no seeds: the code and seeds that made them are not "
            "in their files): latent_dim=32")  # fmt: skip
    for fmt in ("markdown", "csv", "json"):
        rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", fmt)
        assert rc == 0
        assert err == warning + (f"seqvae compare: {note}\n" if fmt == "csv" else "")
        assert (f"- {note}" in out.splitlines()) is (fmt == "markdown")
    doc = json.loads(out)
    assert doc["warnings"] == [warning.removeprefix("seqvae compare: warning: ").rstrip("\n"), note]
    runs = {Path(r["path"]).parent.name: r for row in doc["rows"] for r in row["runs"]}
    assert runs["a"]["provenance"] == prov("a" * 40) and runs["c"]["provenance"] is None


def test_filled_in_defaults_are_named(tmp_path, capsys):
    make_run(tmp_path, "max", 1, metrics(100.0, 60.0), drop=("init", "bn_eps"))
    make_run(tmp_path, "max", 2, metrics(101.0, 60.0))
    make_run(tmp_path, "last", 1, metrics(100.0, 60.0), drop=("init",), pooling="last")
    make_run(tmp_path, "last", 2, metrics(100.0, 60.0), drop=("init",), pooling="last")
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*")
    assert rc == 0 and err == ""
    lines = out.splitlines()
    assert len(md_rows(out)) == 2 and lines[4] == ""  # still two groups; a blank line ends the table
    assert lines[5:] == [
        "- Filled in model.init=reference (config.yaml written before the key existed; the default then): pooling=last (all 2)",
        "- Filled in model.init=reference, model.bn_eps=1e-05 (config.yaml written before the key existed; "
        "the default then): pooling=max (seed1)",
    ]
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", "csv")
    assert err.splitlines()[0].startswith("seqvae compare: Filled in model.init=reference (")
    assert all("Filled" not in line for line in out.splitlines())  # the CSV stays one table
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", "json")
    doc = json.loads(out)
    assert len(doc["warnings"]) == 2
    runs = {(Path(r["path"]).parent.name, r["seed"]): r for row in doc["rows"] for r in row["runs"]}
    assert runs["max", 1]["filled_in"] == {"model.init": "reference", "model.bn_eps": 1e-5} and runs["max", 2]["filled_in"] == {}


def test_csv_with_baseline(tmp_path, capsys):
    diff_runs(tmp_path, "base", {1: 100.0, 2: 101.0, 3: 103.0}, latent_dim=8)
    diff_runs(tmp_path, "b", {1: 105.0, 2: 107.0, 3: 110.0}, latent_dim=32)
    rc, out, err = vs_base(capsys, tmp_path, "--format", "csv")
    assert rc == 0
    table = list(csv.reader(io.StringIO(out)))
    header = table[0]
    diff_columns = header[-(2 + 4 * len(compare.DIFF_METRICS)) :][:6]
    assert diff_columns == ["baseline", "paired_by", *(f"iw_nll_diff_{s}" for s in ("mean", "lo", "hi", "n"))]
    rows = {r[0]: dict(zip(header, r)) for r in table[1:]}
    assert rows["base"]["baseline"] == "1" and rows["base"]["iw_nll_diff_mean"] == ""
    assert rows["b"]["baseline"] == "0" and float(rows["b"]["iw_nll_diff_mean"]) == 6.0
    assert float(rows["b"]["iw_nll_diff_lo"]) == pytest.approx(6 - T2 / math.sqrt(3)) and rows["b"]["iw_nll_diff_n"] == "3"
    first, seeds, flat = err.splitlines()  # the pairing line, seeds needed, why MI's "+0.00 on every seed" has no interval
    assert seeds.startswith("seqvae compare: seeds needed for a 95% interval by seed of the IW-NLL") and seeds.endswith(": b 3")
    assert first == "seqvae compare: b: paired by seed with base, seeds 1, 2, 3 (n = 3, t(0.975, 2) = 4.303)"
    assert flat.startswith("seqvae compare: on every seed (n/n): every paired difference was the same")


def test_mc_standard_errors_shown_when_recorded(tmp_path, capsys):
    make_run(tmp_path, "max", 1, metrics(100.0, 60.0) | {"test/iw_nll_se": 0.3, "test/mi_dataset_se": 0.02})
    make_run(tmp_path, "max", 2, metrics(101.0, 60.0) | {"test/iw_nll_se": 0.4, "test/mi_dataset_se": 0.02})
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*")
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert headers[2:4] == ["IW-NLL", "IW-NLL MC se"] and cells[2:4] == ["100.50 ± 0.71", "0.35"]  # √((0.3² + 0.4²)/2)
    assert cells[headers.index("MI(dataset) MC se")] == "0.020"
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--format", "json")
    assert json.loads(out)["rows"][0]["iw_nll_se"] == {"mean": pytest.approx(math.sqrt(0.125)), "std": None}


def test_baseline_errors_are_one_line(tmp_path, capsys):
    diff_runs(tmp_path, "a", {1: 100.0}, latent_dim=8)
    diff_runs(tmp_path, "b", {1: 100.0}, latent_dim=16)
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--baseline", f"{tmp_path}/nothing*")
    assert (rc, out) == (2, "") and err == f"seqvae compare: error: --baseline '{tmp_path}/nothing*': no run directories match\n"
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--baseline", f"{tmp_path}/yahoo/*/seed1")
    assert (rc, out) == (2, "")
    assert err == (f"seqvae compare: error: --baseline '{tmp_path}/yahoo/*/seed1': its 2 runs are 2 configurations, not one "
                   "(they differ in model.latent_dim)\n")  # fmt: skip
    (tmp_path / "yahoo" / "b" / "seed1" / "metrics.json").unlink()
    rc, out, err = run_compare(capsys, f"{tmp_path}/yahoo/a/seed1", "--baseline", f"{tmp_path}/yahoo/b/seed1")
    assert (rc, out) == (2, "")
    assert err == f"seqvae compare: error: --baseline {tmp_path}/yahoo/b/seed1: not a run directory (no metrics.json)\n"


def test_folds_in_paired_gap_on_the_committed_results(capsys, monkeypatch):
    """Each yahoo10k-short method's IW-NLL gap to the LM of the same seed, as scripts/paired_gap.py gave it."""
    monkeypatch.chdir(REPO)
    root = Path("docs/results/yahoo10k_short")
    rc, out, _ = run_compare(capsys, f"{root}/*/seed*", "--label", "dir", "--baseline", f"{root}/lm/seed*")
    assert rc == 0
    rows = md_rows(out)

    def nll(variant, seed):
        return json.loads((root / variant / f"seed{seed}" / "metrics.json").read_text())["test/iw_nll"]

    d = [nll("abs", s) - nll("lm", s) for s in (1, 2, 3)]
    mean, half = statistics.fmean(d), T2 * statistics.stdev(d) / math.sqrt(3)
    mark = "*" if mean - half > 0 or mean + half < 0 else ""
    assert rows["abs"][:3] == ["3", "seed, n=3", f"{mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}]{mark}"]
    assert rows["abs"][2].startswith("+3.14 ")  # the paired_gap table's "+3.14 ± 0.83"
    assert rows["aggressive"][:3] == ["1", "one run each", f"{nll('aggressive', 1) - nll('lm', 1):+.2f} (n/a)"]
    assert len(rows) == len(list(root.iterdir()))  # every method, the LM as the baseline row


def test_a_glob_skips_predict_and_unfinished_runs_and_retests_group_with_their_run(runs, capsys):
    (runs / "yahoo" / "max" / "seed2" / "metrics.json").unlink()  # a predict run or an unfinished fit
    retest = runs / "yahoo" / "last" / "seed3"
    shutil.copytree(runs / "yahoo" / "last" / "seed2", retest)
    config = yaml.safe_load((retest / "config.yaml").read_text())
    config.update(seed_everything=3, verbose=True, ckpt_path="x.ckpt")  # what `seqvae test` records
    config["data"]["vocab"] = "x.ckpt"
    (retest / "config.yaml").write_text(yaml.safe_dump(config))
    rc, out, err = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--format", "json")
    assert rc == 0, err
    assert "skipped 1 directories without metrics.json" in err and "max/seed2" in err
    rows = {r["label"]: r["n"] for r in json.loads(out)["rows"]}
    assert rows == {"pooling=last": 3, "pooling=max": 2}
    (runs / "yahoo" / "max" / "seed1" / "metrics.json").unlink()
    (runs / "yahoo" / "max" / "seed3" / "metrics.json").unlink()
    rc, _, err = run_compare(capsys, f"{runs}/yahoo/max/seed*")
    assert rc == 2 and "no finished runs" in err
