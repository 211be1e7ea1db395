"""iVAE's dual-KL penalty (seqvae/core/dual_kl.py; ../shared/SPEC.md §11 checks 3, 5, 6): the NWJ
dual against a known KL, the critics' and the VAE's steps leaving each other's weights alone, the
reference's β schedule, and `seqvae fit` with the iVAE configs writing the reference's estimates
beside the exact metrics."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
import yaml
from test_model import datamodule, tiny_model, trainer, write_corpus

from seqvae import Adam, DualKL, FullCovGaussianPosterior, LinearKLWarmup
from seqvae.core.dual_kl import nwj_dual

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the dual against a known KL
def test_nwj_dual_of_the_analytic_critic_is_the_kl_and_a_perturbed_one_is_below_it():
    # SPEC §11 check 3: Q = N(m, I), P = N(0, I), d = 32, m = (1, 1, 0, …): KL = ‖m‖²/2 = 1;
    # T = log dQ/dP = mᵀz − ½‖m‖² attains it; T + 0.5·z₁ gives 2.5 − e^0.625 exactly.
    gen = torch.Generator().manual_seed(0)
    n, d = 1_000_000, 32
    m = torch.zeros(d, dtype=torch.float64)
    m[:2] = 1.0
    zq = torch.randn(n, d, generator=gen, dtype=torch.float64) + m
    zp = torch.randn(n, d, generator=gen, dtype=torch.float64)
    t = lambda z: z @ m - 0.5 * m.pow(2).sum()  # noqa: E731
    assert float(nwj_dual(t(zq), t(zp), 0)) == pytest.approx(1.0, abs=0.03)
    perturbed = lambda z: t(z) + 0.5 * z[:, 0]  # noqa: E731
    assert float(nwj_dual(perturbed(zq), perturbed(zp), 0)) == pytest.approx(2.5 - math.exp(0.625), abs=0.03)


def test_a_trained_critic_approaches_the_kl_from_below():
    # ν_z trained on draws of Q = N(m, I) (the aggregate-posterior critic's setting), d = 4,
    # KL = 1: after training, its dual on fresh draws lies within 3 s.e. below 1 + 3 s.e.,
    # and well above the untrained critic's.
    torch.manual_seed(0)
    d, m = 4, torch.tensor([1.0, 1.0, 0.0, 0.0])
    critics = DualKL(hidden=32, layers=2, lr=3e-3).build(d, 1)
    fresh = lambda n: (torch.randn(n, d) + m, torch.randn(n, d))  # noqa: E731
    with torch.no_grad():
        zq, zp = fresh(100_000)
        untrained = float(nwj_dual(critics.t_z(zq), critics.t_z(zp)))
    for _ in range(600):
        critics.train_steps(torch.randn(256, d) + m, torch.zeros(256, 1), steps=1)
    with torch.no_grad():
        zq, zp = fresh(100_000)
        tq, tp = critics.t_z(zq).double(), critics.t_z(zp).double()
    value = float(nwj_dual(tq, tp))
    se = math.sqrt(float(tq.var() / tq.numel() + tp.exp().var() / tp.numel()))
    assert value <= 1.0 + 3 * se
    assert value >= 0.85, (value, untrained)
    assert untrained < 0.5


# ------------------------------------------------------------------ gradient isolation
@pytest.fixture
def corpus(tmp_path):
    write_corpus(tmp_path / "train.txt", 40, 0)
    write_corpus(tmp_path / "valid.txt", 16, 1)
    write_corpus(tmp_path / "test.txt", 16, 2)
    return tmp_path


def ivae_model(vocab_size, steps=2, **kw):
    penalty = DualKL(steps=steps, hidden=8, layers=1, lr=1e-2, test_samples=3)
    return tiny_model(vocab_size, posterior=FullCovGaussianPosterior(), kl_penalty=penalty, **kw)


def snapshot(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def assert_unchanged(before, module):
    for name, p in module.named_parameters():
        assert torch.equal(before[name], p), name
        assert p.grad is None, f"{name} holds a gradient"


def test_critic_steps_leave_the_vae_bit_identical(corpus):
    # SPEC §11 check 5, first half: the critics learn from the batch's draws and features
    # without a gradient reaching (or a weight of) the encoder or the decoder.
    pl.seed_everything(0)
    dm = datamodule(corpus)
    dm.setup("fit")
    model = ivae_model(dm.vocab_size)
    batch = next(iter(dm.train_dataloader()))
    vae = {"encoder": model.encoder, "decoder": model.decoder}
    before = {k: snapshot(m) for k, m in vae.items()}
    critics_before = snapshot(model.penalty_module)
    q, h = model.encoder.encode(batch["tokens"], batch["lengths"])  # with the graph: z and h track the encoder
    model.penalty_module.train_steps(q.sample(1)[:, 0], h, steps=3)
    for k, m in vae.items():
        assert_unchanged(before[k], m)
    changed = [n for n, p in model.penalty_module.named_parameters() if not torch.equal(critics_before[n], p)]
    assert len(changed) == len(critics_before)  # every critic weight moved


def test_the_encoder_gets_the_critics_gradient_only_through_z(corpus):
    # SPEC §11.1/§11.3: the reference's encoder returns h detached; only the reparameterised z carries the
    # penalty's gradient to the encoder. The penalty term's gradient with respect to h must be absent.
    pl.seed_everything(0)
    dm = datamodule(corpus)
    dm.setup("fit")
    model = ivae_model(dm.vocab_size, steps=1)
    batch = next(iter(dm.train_dataloader()))
    q, h = model.encoder.encode(batch["tokens"], batch["lengths"])
    z = q.sample(1)[:, 0].detach().requires_grad_()  # a leaf: h's only path left is the critic's own input
    term = model.kl_penalty.term(None, z, h, model.penalty_module)  # trains the critics one step, then T(z, h)
    grad_h, grad_z = torch.autograd.grad(term.sum(), [h, z], allow_unused=True)
    assert grad_h is None or not bool(grad_h.any())
    assert grad_z is not None and bool(grad_z.abs().sum() > 0)


def test_the_vae_step_leaves_the_critics_bit_identical(corpus):
    # SPEC §11 check 5, second half: with no critic steps, a training run's VAE updates move the
    # encoder and the decoder and leave every critic weight as built, without a gradient.
    pl.seed_everything(0)
    dm = datamodule(corpus)
    model = ivae_model(dm.vocab_size, steps=0, optimizer=Adam(lr=1e-2))
    critics_before = snapshot(model.penalty_module)
    encoder_before = snapshot(model.encoder)
    trainer(corpus, limit_train_batches=3, limit_val_batches=0).fit(model, dm)
    assert model.num_updates == 3
    assert_unchanged(critics_before, model.penalty_module)
    assert all(not torch.equal(encoder_before[n], p) for n, p in model.encoder.named_parameters() if p.requires_grad)


def test_the_critics_and_their_optimisers_travel_in_the_checkpoint(corpus, tmp_path):
    pl.seed_everything(0)
    dm = datamodule(corpus)
    model = ivae_model(dm.vocab_size)
    t = trainer(corpus, limit_train_batches=2, limit_val_batches=0, enable_checkpointing=False)
    t.fit(model, dm)
    t.save_checkpoint(tmp_path / "a.ckpt")
    saved = torch.load(tmp_path / "a.ckpt", weights_only=True)
    adam_states = saved["state_dict"]["penalty_module._extra_state"]
    assert [s["state"][0]["step"].item() for s in adam_states] == [4.0, 4.0]  # 2 batches x 2 rounds, each critic
    loaded = ivae_model(dm.vocab_size)
    loaded.load_state_dict(saved["state_dict"])
    assert torch.equal(loaded.penalty_module.xz[0].weight, model.penalty_module.xz[0].weight)
    loaded.penalty_module._restore_optimizers()
    for mine, theirs in zip(loaded.penalty_module.optimizers, model.penalty_module.optimizers):
        assert torch.equal(mine.state_dict()["state"][0]["exp_avg"], theirs.state_dict()["state"][0]["exp_avg"])


# ------------------------------------------------------------------ the reference's β schedule
def test_the_reference_beta_schedule_of_the_ivae_configs():
    # SPEC §11 check 6: β after batch n = min(1, 0.1 + n/(10·N_b)), first 1 at n = 9·N_b.
    schedule = yaml.safe_load((REPO / "configs/yahoo10k/ivae.yaml").read_text())["model"]["kl_schedule"]
    assert schedule["class_path"] == "seqvae.LinearKLWarmup"
    warmup = LinearKLWarmup(**schedule["init_args"])
    nb = 250
    for n in (1, 2, 100, nb, 5 * nb + 7, 9 * nb - 1):
        assert warmup.weight(n - 1, nb, 40) == pytest.approx(min(1.0, 0.1 + n / (10 * nb)), abs=1e-12)
    assert warmup.weight(9 * nb - 2, nb, 40) < 1.0 == warmup.weight(9 * nb - 1, nb, 40)


# ------------------------------------------------------------------ the CLI, end to end
def test_fit_with_the_ivae_demo_config_writes_the_reference_estimates_beside_the_exact_metrics(tmp_path):
    lines = ["the cat sat on the mat", "a dog ran far", "the big dog sat", "a small cat ran away on the mat"]
    for name, n in (("train", 48), ("valid", 12), ("test", 12)):
        (tmp_path / f"{name}.txt").write_text("\n".join(lines[i % 4] for i in range(n)) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    args = [
        "fit", "--config", REPO / "configs/demo.yaml", "--config", REPO / "configs/ivae/demo.yaml",
        "--data.train", "train.txt", "--data.val", "valid.txt", "--data.test", "test.txt", "--data.batch_size", "8",
        "--model.embed_dim", "8", "--model.hidden_dim", "12", "--model.latent_dim", "4",
        "--model.val_iw_samples", "0", "--model.test_iw_samples", "3",
        "--model.kl_penalty.init_args.hidden", "8", "--model.kl_penalty.init_args.test_samples", "4",
        "--trainer.max_epochs", "1", "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", tmp_path / "runs",
    ]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "seqvae", *map(str, args)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "ivae" / "version_0"
    m = json.loads((run / "metrics.json").read_text())
    for key in ("nll_bar", "rec_bar", "dual_kl", "dual_kl_z", "dual_mi", "sigma_min_L", "iw_nll", "kl", "mi", "au"):
        assert math.isfinite(m[f"test/{key}"]), key
    assert m["test/nll_bar"] == pytest.approx(m["test/rec_bar"] + m["test/dual_kl"], abs=1e-4)
    # NLL-bar per text, beside the IW-NLL of the same texts (seqvae.analysis.estimator_gap pairs them)
    with (run / "per_text.csv").open(newline="") as f:
        texts = list(csv.DictReader(f))
    assert len(texts) == 12 and all(math.isfinite(float(t["nll_bar"])) for t in texts)
    assert sum(float(t["nll_bar"]) for t in texts) / 12 == pytest.approx(m["test/nll_bar"], abs=1e-3)
    assert m["test/dual_mi"] == pytest.approx(m["test/dual_kl"] - m["test/dual_kl_z"], abs=1e-4)
    # SPEC §11 check 4 on this (barely trained) model: the dual is below the exact KL (so NLL-bar = rec_bar + dual
    # is below rec_bar + KL), and the IW-NLL below the −ELBO: per text, both estimated on the same checkpoint, the
    # mean of IW-NLL − (one-draw) −ELBO within 3 standard errors of ≤ 0
    assert m["test/dual_kl"] <= m["test/kl"] and m["test/nll_bar"] <= m["test/rec_bar"] + m["test/kl"]
    gaps = [float(t["iw_nll"]) - float(t["neg_elbo"]) for t in texts]
    mean_gap = sum(gaps) / len(gaps)
    se = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / (len(gaps) - 1) / len(gaps))
    assert mean_gap <= 3 * se, (mean_gap, se)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["model"]["optimizer"]["class_path"] == "seqvae.Adam"
    assert config["model"]["kl_penalty"]["init_args"]["critic"] == "xz"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert "penalty_module.xz.0.weight" in ckpt["state_dict"] and "penalty_module._extra_state" in ckpt["state_dict"]


def test_penalty_text_columns_stay_aligned_with_their_texts():
    """update_text_columns after each update: the rows come back sorted by text with their own values;
    a batch the penalty gave nothing for, NaN; a metric without the column, no column."""
    from seqvae.core.metrics import EvalMetrics

    m = EvalMetrics(0, 1, per_text=True, text_columns=("nll_bar",))
    for idx, bar in (([2, 0], [12.0, 10.0]), ([1], None), ([3], [13.0])):
        b = len(idx)
        m.update(torch.ones(b), torch.zeros(b), torch.full((b,), 4), index=torch.tensor(idx))
        m.update_text_columns({} if bar is None else {"nll_bar": torch.tensor(bar)}, b)
    rows = m.per_text_rows()
    assert rows["index"].tolist() == [0, 1, 2, 3]
    assert rows["nll_bar"][[0, 2, 3]].tolist() == [10.0, 12.0, 13.0] and math.isnan(rows["nll_bar"][1])
    assert DualKL(test_samples=0).text_columns == () and DualKL().text_columns == ("nll_bar",)
