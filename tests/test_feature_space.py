"""scripts/studies.py feature-space (the paper's Figure 2) on a tiny corpus, one epoch per model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from script_loader import load_script
from test_model import write_corpus

REPO = Path(__file__).resolve().parents[1]


def load_feature_space():
    return load_script("studies")


def test_feature_space_trains_then_loads(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(REPO)
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 60, seed)
    tiny = {
        "data": {"train": str(tmp_path / "train.txt"), "val": str(tmp_path / "valid.txt"), "test": str(tmp_path / "test.txt")},
        "model": {"embed_dim": 8},
        "trainer": {"enable_model_summary": False},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    script = load_feature_space()
    argv = ["--config", str(tmp_path / "tiny.yaml"), "--epochs", "1"]
    argv += ["--root", str(tmp_path / "runs"), "--out", str(tmp_path / "fig")]
    assert script.feature_space_main(argv) == 0
    out, err = capsys.readouterr()
    for variant in ("last", "cosine", "max"):
        assert (tmp_path / "fig" / f"demo_{variant}.png").stat().st_size > 1000
        assert f"{variant}: mean pairwise cosine " in out and "over 60 texts" in out
        config = yaml.safe_load((tmp_path / "runs" / variant / "seed1" / "config.yaml").read_text())
        assert config["model"]["hidden_dim"] == 3 and config["model"]["latent_dim"] == 3
    assert (tmp_path / "fig" / "demo.png").is_file()
    assert "seqvae.CosineDispersion" in (tmp_path / "runs" / "cosine" / "seed1" / "config.yaml").read_text()
    assert (tmp_path / "fig" / "demo_kl.png").stat().st_size > 1000  # Figure 3: validation KL of each model
    assert all(f"{v}: validation KL " in out for v in ("last", "cosine", "max"))
    # a second call loads the trained models instead of training them again
    assert script.feature_space_main(argv) == 0
    out, err = capsys.readouterr()
    assert err.count("), skipped\n") == 3 and "starting" not in err


def test_features_are_the_pooled_encoder_states(tmp_path):
    from seqvae import SeqVAE
    from seqvae.text.datamodule import TextDataModule

    write_corpus(tmp_path / "train.txt", 30, 0)
    dm = TextDataModule(str(tmp_path / "train.txt"))
    model = SeqVAE(dm.vocab_size, embed_dim=8, hidden_dim=3, latent_dim=3, pooling="max")
    model.vocab = dm.vocab
    texts = dm.corpora["train"].texts
    h = model.features([" ".join(t) for t in texts], batch_size=7)
    assert h.shape == (30, 3)
    mu, _ = model.encode([" ".join(t) for t in texts])
    torch.testing.assert_close(model.encoder.to_posterior(h).chunk(2, dim=-1)[0], mu)


def test_feature_space_yahoo10k_is_the_papers_size_with_the_asked_schedule_and_init(tmp_path, monkeypatch):
    """yahoo10k: only the encoder has 3 units (the paper's §4.2); --warmup-epochs, --init and --tag reach the runs."""
    monkeypatch.chdir(REPO)
    script = load_feature_space()
    seen = {}

    def grid_cells(grid, name):  # what the study asks the sweep to train, without training it
        seen.update(grid)
        return []

    monkeypatch.setattr(script, "grid_cells", grid_cells)
    monkeypatch.setattr(script, "run_grid", lambda cells: [])
    argv = ["--dataset", "yahoo10k", "--epochs", "104", "--warmup-epochs", "96", "--init", "pytorch", "--tag", "long"]
    assert script.feature_space_main(argv + ["--out", str(tmp_path / "fig")]) == 0
    assert seen["root"] == "runs/feature_space/yahoo10k_long" and seen["configs"] == ["configs/yahoo10k/base.yaml"]
    overrides = seen["overrides"]
    assert overrides["model.encoder_hidden_dim"] == 3 and "model.hidden_dim" not in overrides
    assert overrides["model.latent_dim"] == 3 and overrides["trainer.max_epochs"] == 104
    assert overrides["model.kl_schedule.init_args.warmup_epochs"] == 96 and overrides["plateau.min_epochs"] == 96
    assert type(overrides["plateau.min_epochs"]) is int  # the CLI refuses 96.0 for an int option (a run failed so)
    assert overrides["model.init"] == "pytorch"


def test_the_long_warmup_script_trains_six_cells_two_at_a_time_then_draws_each_init(tmp_path):
    """scripts/feature_space_long.sh with a stand-in python that records its calls: each (init, variant) once on
    one thread, then one drawing call per init over all three variants (issue 50's Figures 2-3), then an export of
    each finished run's small files."""
    import os
    import subprocess

    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$OMP_NUM_THREADS $*" >> {log}\n')
    fake.chmod(0o755)
    finished = tmp_path / "runs/feature_space/yahoo10k_long_pytorch/cosine/seed1"  # the one run that has finished
    finished.mkdir(parents=True)
    (finished / "metrics.json").write_text("{}")
    proc = subprocess.run(["bash", str(REPO / "scripts/feature_space_long.sh")], cwd=tmp_path,
                          env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    export = "docs/results/feature_space_long/pytorch/cosine/seed1"
    assert calls[8:] == [f"1 -m seqvae export runs/feature_space/yahoo10k_long_pytorch/cosine/seed1 {export}"]
    calls = calls[:8]
    study = "scripts/studies.py feature-space --dataset yahoo10k --epochs 104 --warmup-epochs 96"
    cells = {
        f"1 {study} --init {i} --tag long_{i} --variants {v}" for i in ("reference", "pytorch") for v in ("last", "cosine", "max")
    }
    assert set(calls[:6]) == cells and len(calls) == 8
    assert calls[6:] == [f"1 {study} --init {i} --tag long_{i}" for i in ("reference", "pytorch")]
