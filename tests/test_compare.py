"""`seqvae compare`, on fake run directories (config.yaml + metrics.json + curves.csv); no training."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path

import pytest
import yaml

from seqvae import cli, compare

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
        "kl_schedule": {"class_path": "seqvae.LinearKLWarmup", "init_args": {"start": 0.1, "warmup_epochs": 10.0}},
    },
    "data": {"batch_size": 32, "seed": 0},
    "checkpoint": {"dirpath": None, "monitor": "val/loss", "filename": "best"},
    "plateau": {"monitor": "val/loss", "patience": 2},
    "ckpt_path": None,
}


def make_run(root: Path, variant: str, seed: int, metrics: dict, curves: list[dict] | None = None, **model) -> Path:
    """docs/results/<dataset>/<variant>/seed<N>/ layout; everything that names the run differs by seed."""
    run = root / "yahoo" / variant / f"seed{seed}"
    run.mkdir(parents=True)
    config = copy.deepcopy(BASE)
    config["seed_everything"] = seed
    config["data"]["seed"] = seed
    config["trainer"]["logger"]["init_args"].update(name=variant, version=f"seed{seed}")
    config["checkpoint"]["dirpath"] = str(run / "checkpoints")
    config["model"].update(model)
    (run / "config.yaml").write_text("# pytorch_lightning==2.6.6\n" + yaml.safe_dump(config))
    (run / "metrics.json").write_text(json.dumps(metrics))
    if curves is not None:
        with open(run / "curves.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(curves[0]))
            writer.writeheader()
            writer.writerows(curves)
    return run


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
    rows = {r["label"]: r for r in json.loads(out)}
    assert set(rows) == {"pooling=max", "pooling=last"}
    mx, last = rows["pooling=max"], rows["pooling=last"]
    assert (mx["n"], last["n"]) == (3, 2)
    assert [Path(p).name for p in mx["runs"]] == ["seed1", "seed2", "seed3"]
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
    (row,) = json.loads(out)
    assert row["n"] == 2 and row["iw_nll"]["mean"] == 101.5


def test_single_run_has_no_std(runs, capsys):
    rc, out, _ = run_compare(capsys, runs / "yahoo" / "max" / "seed2", "--format", "json")
    assert rc == 0
    (row,) = json.loads(out)
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
    rows = {r["label"]: r for r in json.loads(out)}
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
    assert [r["label"] for r in json.loads(out)] == [
        "kl_schedule=LinearKLWarmup, start=0.1, warmup_epochs=10.0, latent_dim=16",
        "kl_schedule=CyclicalKL, cycles=4, latent_dim=32",
    ]


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
    rc, _, err = run_compare(capsys, f"{runs}/yahoo/max/seed*")
    assert rc == 2 and err.startswith("seqvae compare: error: ") and "no metrics.json" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["compare", str(runs / "yahoo")])
    assert exit_.value.code == 2
    assert "not a run directory (no config.yaml or metrics.json)" in capsys.readouterr().err


def test_plots(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "plots"
    rc, _, err = run_compare(capsys, f"{runs}/yahoo/*/seed*", "--plots", out_dir)
    assert rc == 0 and f"wrote 5 plots to {out_dir}" in err
    names = sorted(p.name for p in out_dir.iterdir())
    assert names == ["val_au.png", "val_feature_cos.png", "val_kl.png", "val_loss.png", "val_mi.png"]
    assert all((out_dir / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


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
    assert err == "seqvae compare: plots skipped: matplotlib is not installed (pip install 'seqvae[plots]')\n"
    assert not (tmp_path / "plots").exists()


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
    old = make_run(tmp_path, "max", 1, metrics(400.0, 60.0))
    new = make_run(tmp_path, "max", 2, metrics(402.0, 60.0))
    config = yaml.safe_load((new / "config.yaml").read_text())
    config["periodic_checkpoint"] = {"every_n_minutes": 10.0, "every_n_batches": None}
    config["model"]["generation"] = {"mode": "reconstruct", "decoding": "greedy"}
    config["trainer"]["use_distributed_sampler"] = False
    (new / "config.yaml").write_text(yaml.safe_dump(config))
    groups = compare.group_runs(compare.find_runs([str(old), str(new)]))
    assert len(groups) == 1 and groups[0]["stats"]["iw_nll"]["mean"] == 401.0


def test_runs_from_before_a_model_key_existed_group_with_its_default_only(tmp_path):
    old = make_run(tmp_path, "max", 1, metrics(400.0, 60.0))  # written before model.init existed
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
