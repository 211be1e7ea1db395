"""scripts/long_warmup.py (`python scripts/studies.py long-warmup-updates`): curves against updates, long against
10-epoch KL warm-up, on synthetic committed curves (values exact)."""

from __future__ import annotations

from script_loader import load_script

long_warmup = load_script("long_warmup")

HEAD = "step,train/lr,epoch,val/feature_cos,val/kl\r\n"


def write_run(folder, rows, name="curves.csv", warmup_epochs=None):
    folder.mkdir(parents=True)
    (folder / name).write_text(HEAD + "".join(f"{s},1.0,{e},{c},{k}\r\n" for e, (s, c, k) in enumerate(rows)))
    if warmup_epochs is not None:
        (folder / "config.yaml").write_text(
            f"model:\n  kl_schedule:\n    class_path: seqvae.LinearKLWarmup\n    init_args: {{start: 0.1, warmup_epochs: {warmup_epochs}}}\n"
        )


def test_table_at_matched_updates_partial_and_missing_runs(tmp_path):
    long_max = tmp_path / long_warmup.LONG / "max"
    # step + 1 = updates: 1000, 3000, 10000, 32000, 35000
    write_run(long_max / "seed1", [(999, 0.9, 2.0), (2999, 0.5, 1.0), (9999, 0.25, 0.5), (31999, 0.125, 0.25),
                                   (34999, 0.0625, 0.125)], warmup_epochs=32)
    write_run(long_max / "seed2", [(999, 0.7, 4.0), (1499, 0.3, 3.0)], name="curves_partial.csv")  # unfinished
    (long_max / "seed3").mkdir()  # a cell not exported yet
    write_run(tmp_path / long_warmup.TEN_EPOCH["max"] / "seed1", [(333, 1.0, 3.0), (3339, 0.75, 0.5)])
    notes = []
    groups = long_warmup.collect(tmp_path, notes.append)

    assert list(groups) == [("max", "long"), ("max", "10-epoch")]
    seed1, seed2 = groups[("max", "long")]["seed1"], groups[("max", "long")]["seed2"]
    assert seed1["updates"] == [1000, 3000, 10000, 32000, 35000] and not seed1["partial"]
    assert seed1["warmup"] == 32 * 1000  # warmup_epochs x the first validation's updates (one epoch)
    assert seed2["partial"] and seed2["warmup"] is None
    assert f"{long_warmup.LONG}/max/seed3: no curves.csv or curves_partial.csv: skipped" in notes
    assert f"{long_warmup.LONG}/last: not there: skipped" in notes
    assert f"{long_warmup.TEN_EPOCH['last']}: not there: skipped" in notes

    rows = long_warmup.table(groups).splitlines()
    # 1k: both seeds (0.9, 0.7 -> 0.8; KL 2, 4 -> 3); 3k on: seed1 only (seed2 stopped at 1500); end: last rows
    assert rows[2] == ("| max | long | 1, 2(partial) | 32000 | 0.800 | 3.000 | 0.500 (1/2) | 1.000 (1/2) | 0.250 (1/2) | "
                       "0.500 (1/2) | 0.125 (1/2) | 0.250 (1/2) | 0.181 | 1.562 | 35000, 1500 |")
    # the first validation at >= 1000 updates is at 3340; none reaches 10k
    assert rows[3] == "| max | 10-epoch | 1 | ? | 0.750 | 0.500 | 0.750 | 0.500 | – | – | – | – | 0.750 | 0.500 | 3340 |"


def test_main_writes_table_and_one_figure_per_pooling(tmp_path, capsys):
    write_run(tmp_path / long_warmup.LONG / "last" / "seed1", [(999, 1.0, 2.0), (1999, 0.5, 1.0)], warmup_epochs=96)
    assert long_warmup.main(["--out", "figs", "--table", "t.md"], root=tmp_path) == 0
    assert (tmp_path / "figs" / "long_warmup_last.png").stat().st_size > 0
    assert not (tmp_path / "figs" / "long_warmup_max.png").exists()
    assert "| last | long | 1 | 96000 | 1.000 | 2.000 | – |" in (tmp_path / "t.md").read_text()


def test_no_curves_anywhere_writes_nothing(tmp_path):
    assert long_warmup.main(["--table", "t.md"], root=tmp_path) == 1
    assert not (tmp_path / "t.md").exists()
