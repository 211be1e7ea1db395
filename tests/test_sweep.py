"""`seqvae sweep`: grid files and their error lines, dry-run command lines, and real tiny grids
(a failing cell does not stop the others; a rerun skips finished cells and resumes interrupted ones)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_model import write_corpus

from seqvae.experiments import cells as cell_files
from seqvae.experiments import sweep

REPO = Path(__file__).resolve().parents[1]
DEMO = "configs/demo.yaml"


def write_grid(path: Path, grid) -> Path:
    path.write_text(grid if isinstance(grid, str) else yaml.safe_dump(grid, sort_keys=False))
    return path


def grid(**changes) -> dict:
    g = {
        "root": "runs/g",
        "configs": [DEMO],
        "overrides": {"trainer.max_epochs": 2},
        "seeds": [1, 2],
        "variants": [
            {"name": "last", "overrides": {"model.pooling": "last"}},
            {"name": "max", "overrides": {"model.pooling": "max"}},
        ],
    }
    g.update(changes)
    return g


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


# ------------------------------------------------------------------------------------- grid files
def test_shipped_demo_grid(in_repo):
    cells = sweep.load_grid("configs/sweeps/demo.yaml")
    assert [c.name for c in cells] == ["last/seed1", "max/seed1", "last/seed2", "max/seed2"]
    assert all(c.run_dir == Path("runs/sweeps/demo") / c.variant / f"seed{c.seed}" for c in cells)


def test_shipped_yahoo10k_grid_matches_the_script(in_repo):
    cells = sweep.load_grid("configs/sweeps/yahoo10k.yaml")
    # the methods: every config but the bases and the recommended recipe (settings of two methods)
    methods = sorted(p.stem for p in Path("configs/yahoo10k").glob("*.yaml") if not p.stem.startswith(("base", "recommended")))
    assert sorted({c.variant for c in cells}) == methods
    assert len(cells) == 3 * len(methods) and {c.seed for c in cells} == {1, 2, 3}
    for c in cells:
        assert c.args[:4] == ["--config", "configs/yahoo10k/base.yaml", "--config", f"configs/yahoo10k/{c.variant}.yaml"]
        assert c.args[4:10] == ["--seed_everything", str(c.seed), "--trainer.max_epochs", "20", "--model.test_iw_samples", "100"]
        assert c.run_dir == Path("runs/yahoo10k") / c.variant / f"seed{c.seed}"  # where the Table-1 runs live
    order = [c.name for c in cells]
    for seed in (1, 2, 3):
        assert order.index(f"autoencoder/seed{seed}") < order.index(f"freebits/seed{seed}")
        fb = next(c for c in cells if c.name == f"freebits/seed{seed}")
        i = fb.args.index("--model.init_encoder_from")
        assert fb.args[i + 1] == f"runs/yahoo10k/autoencoder/seed{seed}/checkpoints/best.ckpt"
        assert fb.needs == [Path(f"runs/yahoo10k/autoencoder/seed{seed}")]


@pytest.mark.parametrize("grid_file", sorted(p.name for p in (REPO / "configs/sweeps").glob("*.yaml")))
def test_every_shipped_grid_loads_and_names_existing_configs(in_repo, grid_file):
    cells = sweep.load_grid(f"configs/sweeps/{grid_file}")
    assert cells and len({c.name for c in cells}) == len(cells)
    for c in cells:
        configs = [c.args[i + 1] for i, a in enumerate(c.args) if a == "--config"]
        missing = [f for f in configs if not Path(f).is_file()]
        assert configs and not missing, f"{c.name}: {missing}"


def test_short_grid_rerun_has_the_first_grids_cells_under_its_own_root(in_repo):
    first = sweep.load_grid("configs/sweeps/yahoo10k_short.yaml")
    rerun = sweep.load_grid("configs/sweeps/yahoo10k_short_rerun.yaml")
    strip = lambda c: [a.replace("yahoo10k_short_rerun", "yahoo10k_short") for a in c.args]  # noqa: E731
    assert [(c.name, strip(c)) for c in rerun] == [(c.name, c.args) for c in first]
    assert {c.run_dir.parts[:2] for c in rerun} == {("runs", "yahoo10k_short_rerun")}


def test_shipped_yahoo_cluster_grid(in_repo):
    cells = sweep.load_grid("configs/sweeps/yahoo.yaml")
    methods = sorted(p.stem for p in Path("configs/yahoo").glob("*.yaml") if not p.stem.startswith(("base", "recommended")))
    assert sorted({c.variant for c in cells}) == methods and len(cells) == 3 * len(methods)
    assert all(c.slurm == {"gpus_per_node": 1, "cpus_per_task": 4, "mem_gb": 32, "timeout_min": 240} for c in cells)
    fb = next(c for c in cells if c.name == "freebits/seed2")
    assert fb.args[fb.args.index("--model.init_encoder_from") + 1] == "runs/yahoo/autoencoder/seed2/checkpoints/best.ckpt"
    assert fb.needs == [Path("runs/yahoo/autoencoder/seed2")]


def test_values_and_precedence(in_repo, tmp_path):
    g = grid(seeds=[3], overrides={"trainer.max_epochs": 2, "model.skip": True, "model.bn_gamma": None, "data.seed": "${seed}"})
    g["variants"] = [
        {
            "name": "v",
            "configs": ["configs/yahoo10k/cosine.yaml"],
            "overrides": {
                "trainer.max_epochs": 4,
                "model.regularizers": [{"class_path": "seqvae.CosineDispersion"}],
                "model.lr": 0.5,
            },
        }
    ]
    (cell,) = sweep.load_grid(write_grid(tmp_path / "g.yaml", g))
    assert cell.args == [
        "--config", DEMO, "--config", "configs/yahoo10k/cosine.yaml", "--seed_everything", "3",
        "--trainer.max_epochs", "4", "--model.skip", "true", "--model.bn_gamma", "null", "--data.seed", "3",
        "--model.regularizers", '[{"class_path": "seqvae.CosineDispersion"}]', "--model.lr", "0.5",
        "--trainer.logger.init_args.save_dir", "runs/g", "--trainer.logger.init_args.name", "v",
        "--trainer.logger.init_args.version", "seed3",
    ]  # fmt: skip


def test_slurm_resources_of_grid_variant(in_repo, tmp_path):
    g = grid(seeds=[1], slurm={"partition": "gpu", "timeout_min": 60, "mem_gb": 8.5})
    g["variants"][1]["slurm"] = {"gpus_per_node": 4, "timeout_min": 600}
    cells = sweep.load_grid(write_grid(tmp_path / "g.yaml", g))
    assert cells[0].slurm == {"partition": "gpu", "timeout_min": 60, "mem_gb": 8.5}
    assert cells[1].slurm == {"partition": "gpu", "timeout_min": 600, "mem_gb": 8.5, "gpus_per_node": 4}


SLURM = "partition, account, qos, constraint, nodes, gpus_per_node, cpus_per_task, timeout_min, mem_gb"
BAD_GRIDS = [
    (grid(extra=1), "extra: unknown key (expected root, configs, overrides, seeds, variants, export, slurm)"),
    ({k: v for k, v in grid().items() if k != "seeds"}, "seeds: missing"),
    (grid(seeds=[1, "two"]), "seeds: expected a list of integers"),
    (grid(seeds=[1, 1]), "seeds: repeated seed"),
    (grid(seeds=[1, -2]), "seeds: each must be in [0, 2**32 - 1], got [-2]"),
    (grid(configs=["configs/nope.yaml"]), "configs[0]: no such file configs/nope.yaml"),
    (grid(configs=DEMO), "configs: expected a list of config file paths"),
    (grid(overrides=["trainer.max_epochs=2"]), "overrides: expected a mapping of dotted keys to values (model.pooling: max)"),
    (
        grid(overrides={"seed_everything": 3}),
        "overrides.seed_everything: set by the sweep (seeds, root and the variant name); remove it",
    ),
    (
        grid(variants=[{"name": "a", "overrides": {"trainer.logger.init_args.name": "b"}}]),
        "variants[0].overrides.trainer.logger.init_args.name: set by the sweep (seeds, root and the variant name); remove it",
    ),
    (
        grid(variants=[{"name": "a", "pooling": "max"}]),
        "variants[0].pooling: unknown key (expected name, configs, overrides, needs, slurm)",
    ),
    (grid(variants=[{"overrides": {}}]), "variants[0].name: missing or not a directory name (letters, digits, _ . + -)"),
    (grid(variants=[{"name": "a/b"}]), "variants[0].name: missing or not a directory name (letters, digits, _ . + -)"),
    (grid(variants=[{"name": "a"}, {"name": "a"}]), "variants[1].name: repeated variant a"),
    (grid(variants=[{"name": "a", "configs": ["nope.yaml"]}]), "variants[0].configs[0]: no such file nope.yaml"),
    (grid(variants=[{"name": "a", "needs": ["b"]}, {"name": "b"}]), "variants[0].needs: b is not a variant listed before a"),
    (
        grid(variants=[{"name": "a", "overrides": {"model.init_encoder_from": "x/${sed}/best.ckpt"}}]),
        "variants[0].overrides.model.init_encoder_from: unknown interpolation ${sed} (known: ${seed}, ${variant}, ${root})",
    ),
    (grid(variants=[]), "variants: missing"),
    (grid(export=["x"]), "export: expected a directory path"),
    (grid(export="README.md"), "export: README.md: README.md is a file, not a directory"),  # was a traceback at export
    (grid(root="README.md/runs"), "root: README.md/runs: README.md is a file, not a directory"),
    ("- just\n- a list\n", "expected a mapping with keys root, configs, overrides, seeds, variants, export, slurm"),
    (grid(slurm=["gpu"]), f"slurm: expected a mapping with keys {SLURM}"),
    (grid(slurm={"partitio": "gpu"}), f"slurm.partitio: unknown key (expected {SLURM})"),
    (grid(slurm={"partition": ""}), "slurm.partition: expected a non-empty string, got ''"),
    (grid(slurm={"mem_gb": 0}), "slurm.mem_gb: expected a positive number, got 0"),
    (grid(slurm={"gpus_per_node": 1.5}), "slurm.gpus_per_node: expected an integer >= 0, got 1.5"),
    (grid(variants=[{"name": "a", "slurm": {"nodes": 0}}]), "variants[0].slurm.nodes: expected an integer >= 1, got 0"),
]


@pytest.mark.parametrize("content, message", BAD_GRIDS, ids=[m.split(":")[0] for _, m in BAD_GRIDS])
def test_grid_errors_are_one_line_naming_file_and_key(in_repo, tmp_path, capsys, content, message):
    path = write_grid(tmp_path / "grid.yaml", content)
    assert sweep.main([str(path)]) == 2
    assert capsys.readouterr().err == f"seqvae sweep: error: {path}: {message}\n"


def test_unreadable_and_invalid_yaml(in_repo, tmp_path, capsys):
    assert sweep.main([str(tmp_path / "none.yaml")]) == 2
    assert capsys.readouterr().err == f"seqvae sweep: error: {tmp_path / 'none.yaml'}: cannot read: No such file or directory\n"
    path = write_grid(tmp_path / "bad.yaml", "root: [unclosed\n")
    assert sweep.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"seqvae sweep: error: {path}:2:1: not valid YAML: ") and err.count("\n") == 1  # line:column


def test_select_variants_and_seeds(in_repo, capsys):
    cells = sweep.select(sweep.load_grid("configs/sweeps/yahoo10k.yaml"), "max,last", "1")
    assert [(c.name, c.index, c.total) for c in cells] == [("last/seed1", 1, 2), ("max/seed1", 2, 2)]
    assert sweep.main(["configs/sweeps/yahoo10k.yaml", "--variants", "maxx", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().endswith("--variants: maxx not in the grid")
    assert sweep.main(["configs/sweeps/yahoo10k.yaml", "--seeds", "4", "--dry-run"]) == 2
    assert capsys.readouterr().err.strip().endswith("--seeds: 4 not in the grid")
    for option, value, says in [("--variants", "", "--variants: expected comma-separated variant names, got ''"),
                                ("--seeds", "1,,", "--seeds: expected comma-separated integers, got '1,,'"),
                                ("--seeds", "", "--seeds: expected comma-separated integers, got ''")]:  # fmt: skip
        assert sweep.main(["configs/sweeps/yahoo10k.yaml", option, value, "--dry-run"]) == 2
        assert capsys.readouterr().err.strip().endswith(says)


def test_dry_run_command_lines(in_repo, tmp_path, capsys):
    root = tmp_path / "runs"
    g = grid(root=str(root), seeds=[7], overrides={"trainer.max_epochs": 2, "model.test_iw_samples": 10})
    g["variants"].append({"name": "cos", "configs": ["configs/yahoo10k/cosine.yaml"]})
    path = write_grid(tmp_path / "grid.yaml", g)
    (root / "max" / "seed7" / "checkpoints").mkdir(parents=True)
    (root / "max" / "seed7" / "checkpoints" / "last.ckpt").write_bytes(b"")
    (root / "cos" / "seed7").mkdir(parents=True)
    (root / "cos" / "seed7" / "metrics.json").write_text("{}")
    assert sweep.main([str(path), "--dry-run"]) == 0
    common = "--seed_everything 7 --trainer.max_epochs 2 --model.test_iw_samples 10"
    logger = f"--trainer.logger.init_args.save_dir {root} --trainer.logger.init_args.name"
    assert capsys.readouterr().out.splitlines() == [
        "# [1/3] last/seed7: start",
        f"seqvae fit --config {DEMO} {common} --model.pooling last {logger} last --trainer.logger.init_args.version seed7",
        "# [2/3] max/seed7: resume",
        f"seqvae fit --config {DEMO} {common} --model.pooling max {logger} max --trainer.logger.init_args.version seed7"
        f" --ckpt_path {root}/max/seed7/checkpoints/last.ckpt",
        f"# [3/3] cos/seed7: finished, skip ({root}/cos/seed7/metrics.json)",
    ]
    assert not (root / "last").exists()  # nothing ran, nothing was created


def test_leftovers_move_aside_and_failures_report_stderr(in_repo, tmp_path, capsys, monkeypatch):
    """A start that failed before its first checkpoint leaves a directory the next start could not
    reuse (config.yaml exists): it moves to failed-seed<N>. A fake fit keeps this fast."""
    script = "import sys; print('some output'); print('boom: the error', file=sys.stderr); sys.exit(3)"
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", script])
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1], variants=[{"name": "a"}]))
    (root / "a" / "seed1").mkdir(parents=True)
    (root / "a" / "seed1" / "config.yaml").write_text("old: 1\n")
    (root / "a" / "failed-seed1").mkdir()
    assert sweep.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert f"seqvae sweep: [1/1] a/seed1: moved the leftovers of a failed start to {root}/a/failed-seed1-2\n" in err
    assert (root / "a" / "failed-seed1-2" / "config.yaml").read_text() == "old: 1\n"
    assert re.search(r"seqvae sweep: \[1/1\] a/seed1: FAILED \(exit 3\) after \d+:\d\d; log ", err)  # any duration
    assert "\n    boom: the error\n" in err
    log = (root / "a" / "seed1" / "sweep.log").read_text()
    assert "some output" in log and "boom: the error" in log
    assert "seqvae sweep: no finished cells to compare" in err


# ------------------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny corpus and a config on top of demo.yaml that trains one epoch in a few seconds."""
    root = tmp_path_factory.mktemp("sweep")
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(root / f"{name}.txt", 60, seed)
    config = {
        "data": {
            "train": str(root / "train.txt"),
            "val": str(root / "valid.txt"),
            "test": str(root / "test.txt"),
            "batch_size": 16,
        },
        "model": {"embed_dim": 8, "hidden_dim": 12, "latent_dim": 4, "val_iw_samples": 0, "test_iw_samples": 3},
        "trainer": {"max_epochs": 1, "enable_model_summary": False},
    }
    (root / "tiny.yaml").write_text(yaml.safe_dump(config))
    return root


def snapshot(run_dir: Path) -> dict:
    return {
        str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run_dir.rglob("*")) if p.is_file()
    }


def test_failing_cell_then_resume(in_repo, tiny, tmp_path, capsys):
    root = tmp_path / "runs"
    base = {"root": str(root), "configs": [DEMO, str(tiny / "tiny.yaml")], "seeds": [1, 2]}
    variants = [
        {"name": "ok", "overrides": {"model.pooling": "max"}},
        {"name": "bad", "overrides": {"data.train": str(tmp_path / "empty.txt")}},  # fails when its fit reads it
        {"name": "dep", "needs": ["bad"]},
    ]
    (tmp_path / "empty.txt").write_text("\n")
    first = write_grid(tmp_path / "first.yaml", {**base, "variants": variants})

    # 1. The failing cells do not stop the others; the exit status says one failed.
    assert sweep.main([str(first)]) == 1
    out, err = capsys.readouterr()
    for seed in (1, 2):
        assert (root / "ok" / f"seed{seed}" / "metrics.json").is_file(), err
        assert "val/loss" in (root / "ok" / f"seed{seed}" / "curves.csv").read_text().splitlines()[0]
        assert not (root / "bad" / f"seed{seed}" / "metrics.json").exists()
        assert not (root / "dep" / f"seed{seed}").exists()
        assert f"seqvae sweep: [{3 * seed - 1}/6] bad/seed{seed}: FAILED (exit 2) after " in err
        assert f"seqvae sweep: [{3 * seed}/6] dep/seed{seed}: blocked: needs {root}/bad/seed{seed} finished first\n" in err
    assert f"    seqvae: error: data.train: {tmp_path / 'empty.txt'}: no non-empty lines" in err  # the failed cell's stderr tail
    assert "seqvae sweep: 6 cells (2 ran, 2 failed, 2 blocked) in " in err
    assert "seqvae sweep: not finished: bad/seed1, dep/seed1, bad/seed2, dep/seed2\n" in err
    assert re.search(r"seqvae sweep: grid 1/6 done, 0 running, 5 left, \d+:\d\d elapsed, ETA \d+:\d\d\n", err)  # ok/seed1 ran
    # every cell counted once: 2 + 2 + 2 + 0 + 0 = 6
    assert re.search(r"seqvae sweep: grid 2/6 done, 2 failed, 2 blocked, 0 running, 0 left, \d+:\d\d elapsed, ETA 0:00\n", err)
    assert "| run | n |" in out and "| ok | 2 |" in out  # the compare table of the finished cells

    # The dry run now skips the finished cells; the failed ones start again in a clean directory.
    # Issue 45, item 11: the dry run names the missing data file of the cells that would fail on it (exit 1).
    variants[1]["overrides"]["data.train"] = str(tiny / "missing.txt")
    missing = write_grid(tmp_path / "missing.yaml", {**base, "variants": variants})
    assert sweep.main([str(missing), "--dry-run"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"# [1/6] ok/seed1: finished, skip ({root}/ok/seed1/metrics.json)"
    assert lines[1] == (
        "# [2/6] bad/seed1: start (after moving the leftovers of a failed start aside), and it would fail: "
        f"data.train: no such file {tiny / 'missing.txt'}"
    )
    assert err.endswith("seqvae sweep: 2 cells would fail on a missing data file: bad/seed1, bad/seed2\n")
    # Run, it starts no cell: one line, exit 2, nothing written (before: each such cell wrote a run
    # directory, failed, and the sweep went on).
    before = {p: snapshot(p) for p in sorted(root.glob("*/*"))}
    assert sweep.main([str(missing)]) == 2
    out, err = capsys.readouterr()
    assert err == (
        f"seqvae sweep: error: {missing}: bad/seed1: data.train: no such file {tiny / 'missing.txt'} (also bad/seed2); "
        "no cell was started\n"
    )
    assert {p: snapshot(p) for p in sorted(root.glob("*/*"))} == before

    # 2. An interrupted cell (checkpoints, no metrics.json) resumes; a finished one is not touched.
    before = snapshot(root / "ok" / "seed1")
    (root / "ok" / "seed2" / "metrics.json").unlink()
    second = write_grid(tmp_path / "second.yaml", {**base, "variants": variants[:1]})
    plots = tmp_path / "plots"
    assert sweep.main([str(second), "--plots", str(plots)]) == 0
    out, err = capsys.readouterr()
    assert f"seqvae sweep: [1/2] ok/seed1: finished ({root}/ok/seed1/metrics.json), skipped\n" in err
    assert f"seqvae sweep: [2/2] ok/seed2: resuming from {root}/ok/seed2/checkpoints/last.ckpt\n" in err
    assert "seqvae sweep: [2/2] ok/seed2: done in " in err
    assert snapshot(root / "ok" / "seed1") == before
    metrics = json.loads((root / "ok" / "seed2" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and "test/iw_nll" in metrics
    log = (root / "ok" / "seed2" / "sweep.log").read_text()
    assert log.count("# ") >= 2 and f"--ckpt_path {root}/ok/seed2/checkpoints/last.ckpt" in log
    assert "| ok | 2 |" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert (plots / "val_loss.png").is_file()

    # 3. --compare only prints the table.
    assert sweep.main([str(second), "--compare", "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("ok,2,")


def test_checkpoint_position_tells_epoch_end_from_mid_epoch(tmp_path):
    def save(name, epoch, processed, last):
        progress = {"current": {"processed": processed}, "is_last_batch": last}
        torch.save({"epoch": epoch, "loops": {"fit_loop": {"epoch_loop.batch_progress": progress}}}, tmp_path / name)
        return tmp_path / name

    assert sweep.checkpoint_position(save("end.ckpt", 2, 334, True), 20) == "epoch 3/20"
    assert sweep.checkpoint_position(save("mid.ckpt", 3, 120, False), 20) == "epoch 4/20, batch 120"
    (tmp_path / "half.ckpt").write_bytes(b"PK\x03")
    assert sweep.checkpoint_position(tmp_path / "half.ckpt", None) is None


FAKE_FIT = """
import json, sys, time
from pathlib import Path
a = sys.argv[1:]
value = lambda key: a[a.index(key) + 1]
logger = "--trainer.logger.init_args."
run = Path(value(logger + "save_dir")) / value(logger + "name") / value(logger + "version")
run.mkdir(parents=True, exist_ok=True)
began = time.time()
time.sleep(1.0)
(run / "config.yaml").write_text("seed_everything: %s\\nmodel: {name: %s}\\n" % (value("--seed_everything"), run.parent.name))
(run / "times.json").write_text(json.dumps([began, time.time()]))
(run / "metrics.json").write_text(json.dumps({"test/iw_nll": 1.0}))
"""


SLOW_FIT = """
import os, signal, sys, time
from pathlib import Path
a = sys.argv[1:]
value = lambda key: a[a.index(key) + 1]
logger = "--trainer.logger.init_args."
run = Path(value(logger + "save_dir")) / value(logger + "name") / value(logger + "version")
def stop(signum, frame):
    (run / "stopped_by").write_text(signal.Signals(signum).name)
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
(run / "pgid").write_text(str(os.getpgid(0)))
(run / "started").write_text("")
time.sleep(60)
"""


# A fit that, like Lightning's, has no SIGINT handler of its own: Python's KeyboardInterrupt stops it
# (unless SIGINT was ignored when it started).
SLOW_FIT_KEYBOARD_INTERRUPT = SLOW_FIT.replace("signal.signal(signal.SIGINT, stop)\n", "").replace(
    "time.sleep(60)", "try:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    stop(signal.SIGINT, None)"
)


@pytest.mark.parametrize("jobs, sigint", [(1, "default"), (2, "default"), (1, "ignored")])
def test_sigterm_stops_the_cells_and_marks_them_interrupted(in_repo, tmp_path, capsys, monkeypatch, jobs, sigint):
    """`kill PID` of the sweep; "ignored": started with `&` from a script, which ignores SIGINT."""
    import signal
    import threading

    fit = SLOW_FIT_KEYBOARD_INTERRUPT if sigint == "ignored" else SLOW_FIT
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", fit, *args])
    monkeypatch.setattr(sweep, "STOP_SECONDS", 10)  # then killed: no stopped_by file
    if sigint == "ignored":
        previous_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        request_restore = lambda: signal.signal(signal.SIGINT, previous_sigint)  # noqa: E731
    else:
        request_restore = lambda: None  # noqa: E731
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1]))
    cells = [root / v / "seed1" for v in ("last", "max")][:jobs]  # one job: only the first cell starts

    def kill_the_sweep():  # `kill PID` of the sweep alone, once both cells run
        deadline = time.time() + 30
        while not all((c / "started").exists() for c in cells) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=kill_the_sweep, daemon=True).start()
    try:
        assert sweep.main([str(path), "--jobs", str(jobs)]) == 130
        assert sigint == "default" or signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # as it was
    finally:
        request_restore()
    err = capsys.readouterr().err
    names = ", ".join(f"{v}/seed1" for v in ("last", "max"))
    assert err.endswith(f"seqvae sweep: interrupted: 2 of 2 cells not finished ({names}); rerun the same command to resume\n")
    for i, c in enumerate(cells):
        assert f"seqvae sweep: [{i + 1}/2] {c.parent.name}/seed1: stopped after " in err  # before its first checkpoint
        assert (c / "stopped_by").read_text() == "SIGINT"  # passed on: no orphaned fit
        # in a process group of its own: a terminal's Ctrl-C reaches the sweep alone, which passes one SIGINT on at once
        assert int((c / "pgid").read_text()) != os.getpgid(0)
        assert json.loads((c / "sweep.run").read_text())["exit"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the sweep's handler is gone


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"model.poolng": "max"}, "variants[1].overrides.model.poolng (variant bad): unrecognized arguments: --model.poolng max"),
        (
            {"model.pooling": "maxx"},
            'variants[1].overrides.model.pooling (variant bad): Parser key "model.pooling": Expected a typing.Literal',
        ),
        # Out-of-range numbers too (seqvae/options.py), on the model, the data and a strategy's init_args.
        ({"model.lr": -1}, "variants[1].overrides.model.lr (variant bad): model.lr: must be > 0, got -1"),
        ({"data.batch_size": 0}, "variants[1].overrides.data.batch_size (variant bad): data.batch_size: must be >= 1, got 0"),
        (
            {"model.kl_penalty": "FreeBits", "model.kl_penalty.target": -2},
            "variant bad: model.kl_penalty.init_args.target: must be >= 0, got -2",  # a key the grid does not have: the variant
        ),
    ],
)
def test_a_variant_the_cli_refuses_stops_the_sweep_before_any_cell(in_repo, tmp_path, capsys, monkeypatch, overrides, message):
    started = []
    monkeypatch.setattr(sweep, "fit_command", lambda args: started.append(args) or [sys.executable, "-c", FAKE_FIT, *args])
    variants = [{"name": "good", "overrides": {"model.pooling": "max"}}, {"name": "bad", "overrides": overrides}]
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(tmp_path / "runs"), seeds=[1], variants=variants))
    for dry in ([], ["--dry-run"]):
        assert sweep.main([str(path), *dry]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"seqvae sweep: error: {path}: {message}"), err
    assert not started and not (tmp_path / "runs").exists()  # not the good variant either


def test_jobs_below_one_is_refused(in_repo, tmp_path, capsys):
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(tmp_path / "runs"), seeds=[1]))
    with pytest.raises(SystemExit) as done:
        sweep.main([str(path), "--jobs", "0"])
    assert done.value.code == 2 and "--jobs: must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_jobs_run_cells_side_by_side_and_needs_wait(in_repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    root = tmp_path / "runs"
    variants = [{"name": "a"}, {"name": "b"}, {"name": "dep", "needs": ["a"]}]
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1], variants=variants))
    assert sweep.main([str(path), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    times = {v: json.loads((root / v / "seed1" / "times.json").read_text()) for v in ("a", "b", "dep")}
    assert times["a"][0] < times["b"][1] and times["b"][0] < times["a"][1]  # a and b overlapped
    assert times["dep"][0] >= times["a"][1]  # dep started after what it needs had finished
    assert "seqvae sweep: 3 cells (3 ran) in " in err
    # The first cell to finish leaves the other of a and b running (dep starts only after this line).
    assert re.search(r"seqvae sweep: grid 1/3 done, 1 running, 1 left, \d+:\d\d elapsed, ETA \d+:\d\d\n", err)


def test_export_copies_each_finished_cell_and_backfills_skipped_ones(in_repo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    root, export = tmp_path / "runs", tmp_path / "results"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), export=str(export), seeds=[1, 2]))
    assert sweep.main([str(path)]) == 0
    err = capsys.readouterr().err
    for v in ("last", "max"):
        for seed in (1, 2):
            run, dst = root / v / f"seed{seed}", export / v / f"seed{seed}"
            for name in ("config.yaml", "metrics.json"):
                assert (dst / name).read_bytes() == (run / name).read_bytes()
            assert not (dst / "times.json").exists()  # only the result files travel
            assert f"{v}/seed{seed}: results copied to {dst}\n" in err
    # A rerun skips every cell and copies nothing up to date; a deleted export is refilled.
    stamp = (export / "last" / "seed1" / "metrics.json").stat().st_mtime_ns
    shutil.rmtree(export / "max")
    assert sweep.main([str(path)]) == 0
    err = capsys.readouterr().err
    assert "last/seed1: results copied" not in err and "max/seed2: results copied" in err
    assert (export / "last" / "seed1" / "metrics.json").stat().st_mtime_ns == stamp
    assert (export / "max" / "seed1" / "metrics.json").is_file()


def test_fresh_machine_skips_exported_cells_and_reruns_only_needed_ones(in_repo, tmp_path, capsys, monkeypatch):
    """A new clone has the committed export directory but no run directories: exported cells are
    skipped, except one whose checkpoint an unfinished cell needs, which runs again first."""
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    export = tmp_path / "results"
    variants = [{"name": "a"}, {"name": "b"}, {"name": "dep", "needs": ["a"]}]
    old = grid(root=str(tmp_path / "old"), export=str(export), seeds=[1, 2], variants=variants)
    first = write_grid(tmp_path / "first.yaml", old)
    assert sweep.main([str(first)]) == 0
    shutil.rmtree(export / "dep" / "seed2")  # seed 2 of dep did not finish on the old machine
    capsys.readouterr()
    root = tmp_path / "new"  # the fresh machine: same export directory, no runs
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), export=str(export), seeds=[1, 2], variants=variants))
    assert sweep.main([str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"# [1/6] a/seed1: exported earlier, skip ({export}/a/seed1/metrics.json)" in out
    assert "# [4/6] a/seed2: start" in out and "# [6/6] dep/seed2: start" in out
    assert "b/seed2: start" not in out
    assert sweep.main([str(path)]) == 0
    err = capsys.readouterr().err
    assert sorted(p.parent.name + "/" + p.name for p in root.glob("*/seed*")) == ["a/seed2", "dep/seed2"]
    assert "[4/6] a/seed2: exported earlier, but a later cell needs its checkpoint: starting again in" in err
    assert f"[2/6] b/seed1: results exported earlier ({export}/b/seed1/metrics.json), skipped" in err
    assert (export / "dep" / "seed2" / "metrics.json").is_file()
    assert "seqvae sweep: 6 cells (4 skipped, 2 ran) in " in err
    # --compare reads the exported cells from the export directory.
    assert sweep.main([str(path), "--compare", "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert len(table["rows"]) == 3  # a, b, dep: two seeds each
    # --no-export reproduces them: every cell without a run directory runs, the export is not touched.
    committed = {p: p.read_bytes() for p in export.rglob("*") if p.is_file()}
    assert sweep.main([str(path), "--no-export", "--variants", "b"]) == 0
    err = capsys.readouterr().err
    assert "seqvae sweep: 2 cells (2 ran) in " in err and "copied" not in err
    assert sorted(p.name for p in (root / "b").glob("seed*")) == ["seed1", "seed2"]
    assert {p: p.read_bytes() for p in export.rglob("*") if p.is_file()} == committed


def test_finished_cells_of_an_edited_grid_stop_the_sweep(in_repo, tmp_path, capsys, monkeypatch):
    """A finished cell is skipped, so once its variant is edited (another value, or a misspelt
    key) the sweep must say so instead of reporting the old results under the new settings."""
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1]))
    assert sweep.main([str(path)]) == 0
    capsys.readouterr()
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    edited = grid(root=str(root), seeds=[1])
    edited["variants"][1]["overrides"]["model.pooling"] = "avg"
    for argv in ([str(write_grid(tmp_path / "edited.yaml", edited))], [str(tmp_path / "edited.yaml"), "--dry-run"]):
        assert sweep.main(argv) == 2
        out = capsys.readouterr()
        assert out.err.strip().splitlines()[-1] == (
            f"seqvae sweep: error: {tmp_path / 'edited.yaml'}: max/seed1 finished with other arguments than the grid gives it "
            f"now: ran with --model.pooling max; the grid now gives --model.pooling avg; move {root / 'max' / 'seed1'} aside "
            "to run it again, or restore the grid"
        )
        assert "finished, skip" not in out.out
    misspelt = grid(root=str(root), seeds=[1])
    misspelt["variants"][1]["overrides"] = {"model.poling": "max"}
    assert sweep.main([str(write_grid(tmp_path / "misspelt.yaml", misspelt)), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "misspelt.yaml: variants[1].overrides.model.poling (variant max): unrecognized arguments: --model.poling" in err
    common = grid(root=str(root), seeds=[1])  # a bad value in the grid's own overrides: named there, not in a variant
    common["overrides"] = {**common.get("overrides", {}), "model.test_iw_samples": "twenty"}
    assert sweep.main([str(write_grid(tmp_path / "common.yaml", common)), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    where = f"{tmp_path / 'common.yaml'}: overrides.model.test_iw_samples (variant last): "
    assert err.startswith(f"seqvae sweep: error: {where}"), err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # nothing moved, deleted or rerun
    assert sweep.main([str(path), "--dry-run"]) == 0  # the grid as it ran: every cell finished
    # an interrupted cell would resume its checkpoint under the new settings: refused the same way
    cell = root / "last" / "seed1"
    (cell / "metrics.json").unlink()
    (cell / "checkpoints").mkdir()
    (cell / "checkpoints" / "last.ckpt").write_bytes(b"")
    edited = grid(root=str(root), seeds=[1])
    edited["variants"][0]["overrides"]["model.pooling"] = "abs"
    capsys.readouterr()
    assert sweep.main([str(write_grid(tmp_path / "edited2.yaml", edited)), "--dry-run"]) == 2
    assert "last/seed1 started with other arguments than the grid gives it now: ran with --model.pooling last; " in (
        capsys.readouterr().err
    )


def test_an_edited_config_file_stops_the_sweep_naming_the_file_and_cells(in_repo, tmp_path, capsys, monkeypatch):
    """Issue 45, item 3: a variant's config file (and one it names, `config: inner.yaml`) is edited
    after its cells ran: the rerun stops in one line naming the file and the cells, not "skipped"
    with the old results. Cells whose sweep.run has no digests (older sweeps) are named in a note."""
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    root = tmp_path / "runs"
    (tmp_path / "inner.yaml").write_text("model:\n  pooling: max\n")
    (tmp_path / "b.yaml").write_text("config: inner.yaml\n")
    variants = [{"name": "a"}, {"name": "b", "configs": [str(tmp_path / "b.yaml")]}]
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1, 2], variants=variants))
    assert sweep.main([str(path)]) == 0
    ran = json.loads((root / "b" / "seed1" / "sweep.run").read_text())["configs"]
    assert list(ran) == [DEMO, str(tmp_path / "b.yaml"), str(tmp_path / "inner.yaml")]
    assert ran[str(tmp_path / "inner.yaml")] == hashlib.sha256(b"model:\n  pooling: max\n").hexdigest()
    capsys.readouterr()
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    (tmp_path / "inner.yaml").write_text("model:\n  pooling: avg\n")
    then, now = hashlib.sha256(b"model:\n  pooling: max\n").hexdigest(), hashlib.sha256(b"model:\n  pooling: avg\n").hexdigest()
    for dry in ([], ["--dry-run"]):
        assert sweep.main([str(path), *dry]) == 2
        out, err = capsys.readouterr()
        assert err.splitlines() == [
            f"seqvae sweep: error: {path}: {tmp_path / 'inner.yaml'} was edited (sha256 {then[:12]} then, {now[:12]} now) "
            f"since b/seed1, b/seed2 ran; move {root / 'b' / 'seed1'}, {root / 'b' / 'seed2'} aside to run them again, "
            "or restore the file"
        ]
        assert "skip" not in out
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before  # nothing ran, moved or deleted
    # A cell recorded before the digests: not checked, and said so; the others still are.
    (tmp_path / "inner.yaml").write_text("model:\n  pooling: max\n")
    for seed in (1, 2):
        run = root / "b" / f"seed{seed}" / "sweep.run"
        run.write_text(json.dumps({k: v for k, v in json.loads(run.read_text()).items() if k != "configs"}))
    (tmp_path / "inner.yaml").write_text("model:\n  pooling: avg\n")
    assert sweep.main([str(path)]) == 0
    err = capsys.readouterr().err
    assert (
        "seqvae sweep: note: b/seed1, b/seed2 ran before the sweep kept its config files' digests: their contents are not "
        "checked (a resumed cell's are from its resume on)\n"
    ) in err
    assert "b/seed1: finished" in err


def test_kill_9_of_the_sweep_stops_its_fit_and_a_rerun_refuses_a_live_one(in_repo, tmp_path, capsys, monkeypatch):
    """Issue 45, item 7: `kill -9` of a sweep mid-cell used to leave its fit training (and a rerun
    resumed beside it). Now the kernel sends the fit SIGINT (PR_SET_PDEATHSIG); and a rerun refuses
    a cell whose recorded fit still runs, in one line naming the pid."""
    import subprocess

    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1], variants=[{"name": "a"}]))
    driver = (
        "import sys\nfrom seqvae.experiments import sweep\n"
        f"sweep.fit_command = lambda args: [sys.executable, '-c', {SLOW_FIT!r}, *args]\n"
        f"sys.exit(sweep.main([{str(path)!r}]))\n"
    )
    cell = root / "a" / "seed1"
    sweep_proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (cell / "started").exists() and time.time() < deadline:
            time.sleep(0.1)
        assert (cell / "started").exists()
        fit_pid = json.loads((cell / "sweep.run").read_text())["pid"]
    finally:
        sweep_proc.kill()  # kill -9: no handler of the sweep runs
        sweep_proc.wait()
    deadline = time.time() + 60
    while not (cell / "stopped_by").exists() and time.time() < deadline:
        time.sleep(0.1)
    assert (cell / "stopped_by").read_text() == "SIGINT"  # the orphan got Lightning's clean stop
    while cell_files.pid_alive(fit_pid) and time.time() < deadline:  # it exits (reaped by init)
        time.sleep(0.1)

    # A fit recorded in sweep.run that still runs (here a sleep this test started): refused, nothing written.
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    (cell / "checkpoints").mkdir(parents=True)
    (cell / "checkpoints" / "last.ckpt").write_bytes(b"")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run = json.loads((cell / "sweep.run").read_text())
        run.update(pid=live.pid, pid_start=cell_files.proc_start(live.pid), started="2026-12-06 01:00:00")
        run.pop("ended", None)
        (cell / "sweep.run").write_text(json.dumps(run))
        before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        for dry in ([], ["--dry-run"]):
            assert sweep.main([str(path), *dry]) == 2
            assert capsys.readouterr().err.splitlines()[-1] == (
                f"seqvae sweep: error: {path}: a/seed1: its previous fit (pid {live.pid}, started 2026-12-06 01:00:00) is still "
                f"running in {cell}; wait for it to end or stop it (kill -INT {live.pid}), then rerun"
            )
        assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    finally:
        live.kill()
        live.wait()
    assert sweep.main([str(path)]) == 0  # once it ended, the cell resumes
    assert f"[1/1] a/seed1: resuming from {cell}/checkpoints/last.ckpt" in capsys.readouterr().err


# Its test under way when the sweep is interrupted: it finishes on the SIGINT (metrics.json, exit 0).
FINISHING_FIT = SLOW_FIT.replace(
    'def stop(signum, frame):\n    (run / "stopped_by").write_text(signal.Signals(signum).name)\n    sys.exit(130)',
    'def stop(signum, frame):\n    (run / "config.yaml").write_text("model: {name: " + run.parent.name + "}\\n")\n'
    '    (run / "metrics.json").write_text("{}")\n    sys.exit(0)',
)


def test_a_cell_that_finishes_after_the_interruption_is_reported_done(in_repo, tmp_path, capsys, monkeypatch):
    """Issue 45, item 11: both cells finished after the SIGINT, yet the sweep said "interrupted"
    and sweep.run recorded them as interrupted."""
    import signal
    import threading

    assert "metrics.json" in FINISHING_FIT
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FINISHING_FIT, *args])
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1]))
    cells = [root / v / "seed1" for v in ("last", "max")]

    def ctrl_c():  # the terminal's SIGINT reaches the sweep (the fits have their own process group)
        deadline = time.time() + 60
        while not all((c / "started").exists() for c in cells) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    assert sweep.main([str(path), "--jobs", "2"]) == 0
    err = capsys.readouterr().err
    for i, c in enumerate(cells):
        assert f"seqvae sweep: [{i + 1}/2] {c.parent.name}/seed1: done in " in err
        assert json.loads((c / "sweep.run").read_text())["exit"] == 0
    assert "seqvae sweep: interrupted after every cell had finished\n" in err
    assert "not finished" not in err and "rerun the same command" not in err


def test_progress_lines_are_written_whole_and_their_counts_add_up(in_repo, tmp_path, capsys, monkeypatch):
    """Issue 45, item 11: `print` wrote a line and its newline apart, so the pool threads' lines ran
    together ("0:18 elapsedseqvae sweep: [1/2]…"); and a resumed grid said "grid 1/3 done, 0 running,
    1 left" (a finished cell not yet skipped was counted nowhere)."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    sweep.say("grid 1/2 done")
    assert writes == ["seqvae sweep: grid 1/2 done\n"]  # one write: no other thread's line between the text and its newline
    sweep.say("FAILED; its tail:", ["tail 1", "tail 2"])
    monkeypatch.undo()
    assert writes[1:] == ["seqvae sweep: FAILED; its tail:\n    tail 1\n    tail 2\n"]

    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1], variants=[{"name": v} for v in "abc"]))
    assert sweep.main([str(path), "--variants", "c"]) == 0
    capsys.readouterr()
    assert sweep.main([str(path)]) == 0
    progress = re.findall(r"grid (\d+)/3 done, (\d+) running, (\d+) left", capsys.readouterr().err)
    assert progress == [("2", "0", "1"), ("3", "0", "0"), ("3", "0", "0")]  # a ran; b ran; c skipped


WARNING_FIT = FAKE_FIT + (
    "print('seqvae: warning: data.val reads yahoo.txt, but data.train is now mine.txt', file=sys.stderr)\n"
    "print('seqvae: warning: data.val reads yahoo.txt, but data.train is now mine.txt', file=sys.stderr)\n"
    "print('an ordinary line', file=sys.stderr)\n"
)


def test_a_cells_warnings_are_repeated_in_the_sweeps_output(in_repo, tmp_path, capsys, monkeypatch):
    """Issue 45, item 11: a variant overriding only data.train validates on another corpus; the
    warning was only in the cell's sweep.log."""
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", WARNING_FIT, *args])
    root = tmp_path / "runs"
    path = write_grid(tmp_path / "grid.yaml", grid(root=str(root), seeds=[1], variants=[{"name": "a"}]))
    assert sweep.main([str(path)]) == 0
    err = capsys.readouterr().err
    assert (
        f"seqvae sweep: [1/1] a/seed1: 1 warning (in {root}/a/seed1/sweep.log):\n"
        "    data.val reads yahoo.txt, but data.train is now mine.txt\n"
    ) in err
    assert "seqvae sweep: warnings (printed above with their cells): a/seed1 (1)\n" in err


def test_the_own_corpus_recipe_keeps_each_corpus_in_its_own_runs_and_stage_two_finds_its_stage_one(tiny, tmp_path, monkeypatch):
    """Issue 45, item 12: the README's recipe on a user's files carried yahoo10k's max_vocab 5000,
    wrote runs/yahoo10k/… for any corpus (a second corpus's stage 1 was refused) and stage 2 read a
    fixed directory. configs/own/: the user's files and save_dir, the whole vocabulary, and a
    stage 2 that loads the stage 1 of its own save_dir and version."""
    from seqvae.cli import SeqVAECLI

    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    for name, seed in (("train", 5), ("valid", 6), ("test", 7)):
        write_corpus(other / f"{name}.txt", 40, seed)

    def stage(config, corpus, save_dir):
        args = [f"--config={REPO / 'configs' / 'own' / config}", f"--data.train={corpus / 'train.txt'}",
                f"--data.val={corpus / 'valid.txt'}", f"--data.test={corpus / 'test.txt'}",
                "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4", "--trainer.max_epochs=1",
                "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2", "--trainer.enable_model_summary=false",
                "--trainer.num_sanity_val_steps=0", f"--trainer.logger.init_args.save_dir={save_dir}"]  # fmt: skip
        cli = SeqVAECLI(args=args, run=False)
        assert cli.datamodule.hparams.max_vocab is None  # every training word, not yahoo10k's 5000
        cli.trainer.fit(cli.model, cli.datamodule)
        return cli

    first = stage("recommended_autoencoder.yaml", tiny, "runs/tiny")
    second = stage("recommended_autoencoder.yaml", other, "runs/other")  # a second corpus: its own directory
    for cli, name in ((first, "tiny"), (second, "other")):
        best = Path(cli.trainer.checkpoint_callback.best_model_path)
        assert best.resolve() == (tmp_path / "runs" / name / "recommended_autoencoder" / "seed1" / "checkpoints" / "best.ckpt")
    words = {w for line in (other / "train.txt").read_text().splitlines() for w in line.split()}
    assert len(second.datamodule.vocab) == len(words) + 4  # the whole vocabulary, besides the 4 reserved ids
    stage2 = SeqVAECLI(args=[f"--config={REPO / 'configs' / 'own' / 'recommended.yaml'}", f"--data.train={other / 'train.txt'}",
                             f"--data.val={other / 'valid.txt'}", f"--data.test={other / 'test.txt'}",
                             "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
                             "--trainer.logger.init_args.save_dir=runs/other"], run=False)  # fmt: skip
    assert stage2.model.hparams.init_encoder_from == "runs/other/recommended_autoencoder/seed1/checkpoints/best.ckpt"
    assert stage2.datamodule.hparams.max_vocab is None


def test_a_data_path_by_interpolation_is_left_to_the_fit(tmp_path):
    # `val: ${data.test}` is a file only once fit merges the config; the check before any cell starts
    # refused such a grid ("no such file ${data.test}").
    (tmp_path / "t.txt").write_text("a b\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data: {{train: {tmp_path / 't.txt'}, test: {tmp_path / 't.txt'}, val: '${{data.test}}'}}\n")
    assert sweep.missing_data_files(["--config", str(config)]) == []
    assert sweep.missing_data_files(["--config", str(config), "--data.train", str(tmp_path / "u.txt")]) == [
        f"data.train: no such file {tmp_path / 'u.txt'}"
    ]


def test_a_data_file_named_in_a_config_that_a_config_includes_is_checked_too(tmp_path):
    # `config: inner.yaml` inside a --config file (jsonargparse reads it relative to the including
    # file): its data files escaped the check, and the cell failed alone after writing its run directory.
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "inner.yaml").write_text(f"data: {{train: {tmp_path / 'gone.txt'}}}\n")
    outer = tmp_path / "sub" / "outer.yaml"
    outer.write_text("config: inner.yaml\nmodel: {latent_dim: 4}\n")
    assert sweep.missing_data_files(["--config", str(outer)]) == [f"data.train: no such file {tmp_path / 'gone.txt'}"]
    (tmp_path / "t.txt").write_text("a b\n")
    outer.write_text(f"config: [inner.yaml]\ndata: {{train: {tmp_path / 't.txt'}}}\n")  # its own key wins
    assert sweep.missing_data_files(["--config", str(outer)]) == []



def test_checkpoint_position_reads_a_checkpoint_holding_a_strategy_in_a_fresh_process(tmp_path):
    # `--status` runs in a process that imported only the sweep: a last.ckpt whose hyper-parameters
    # pickled a strategy object (a KL schedule) must still be read, through the one loader that
    # declares the classes a file names (a bare torch.load(weights_only=True) refused it: None).
    from seqvae.core.schedules import LinearKLWarmup

    path = tmp_path / "last.ckpt"
    torch.save({"epoch": 2, "hyper_parameters": {"kl_schedule": LinearKLWarmup(0.1, 10.0)}}, path)
    code = f"from seqvae.experiments.cells import checkpoint_position; print(checkpoint_position({str(path)!r}, 20))"
    env = os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "epoch 3/20"
