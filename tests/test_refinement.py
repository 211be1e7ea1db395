"""SA-VAE's refinement (`model.refine`, seqvae/core/refinement.py; SPEC §13): plain training at 0
steps, the SVI steps lower each text's −ELBO, the end-to-end gradient is the exact one (float64
finite differences), the momentum recursion and the KL-only gradient of a decoder that ignores z,
refusals in one line, and `seqvae fit` end to end on a tiny corpus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqvae import SeqVAE, SVIRefinement
from seqvae.core.gaussian import DiagonalGaussian
from seqvae.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=20, embed_dim=8, hidden_dim=16, latent_dim=4)  # SPEC §13 check 2's model


def tiny_batch(b: int = 5, t: int = 6, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, TINY["vocab_size"], (b, t), generator=g)
    tokens[:, 0], tokens[:, -1] = 1, 2  # <s> … </s>
    return {"tokens": tokens, "lengths": torch.full((b,), t)}


def tiny_model(refine=None, seed: int = 0, **options) -> SeqVAE:
    torch.manual_seed(seed)
    model = SeqVAE(**dict(TINY, **options), refine=refine)
    with torch.no_grad():  # posterior means away from 0 and a decoder that reads z: the steps have work to do
        model.encoder.to_posterior.weight.mul_(40.0)
        model.decoder.z_to_c0.weight.mul_(40.0)
    return model


def loss_and_grads(model, batch, kl_weight=0.7, noise_seed=3):
    torch.manual_seed(noise_seed)  # the same ε and dropout masks for every model given the same seed
    model.zero_grad()
    loss = model.loss_terms(batch, kl_weight)["loss"]
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_zero_steps_is_plain_training_bit_for_bit():
    batch = tiny_batch()
    plain_loss, plain = loss_and_grads(tiny_model(), batch)
    sa_loss, sa = loss_and_grads(tiny_model(SVIRefinement(steps=0)), batch)
    assert torch.equal(plain_loss, sa_loss)
    assert plain.keys() == sa.keys() and all(torch.equal(plain[k], sa[k]) for k in plain)
    _, refined = loss_and_grads(tiny_model(SVIRefinement(steps=2)), batch)
    assert not torch.equal(plain["encoder.to_posterior.weight"], refined["encoder.to_posterior.weight"])


def negative_elbo(model, batch, q, samples: int = 400) -> torch.Tensor:
    """−ELBO per text, its expectation over z estimated with the same `samples` draws for every q: (B,)."""
    eps = torch.randn((q.mu.size(0), samples, q.mu.size(1)), generator=torch.Generator().manual_seed(5), dtype=q.mu.dtype)
    z = q.mu.unsqueeze(1) + (0.5 * q.logvar).exp().unsqueeze(1) * eps
    return -model.decoder.log_likelihood(batch["tokens"], batch["lengths"], z).mean(1) + q.kl()


def test_svi_steps_lower_every_texts_negative_elbo_on_a_fixed_decoder():
    model = tiny_model(SVIRefinement(steps=10), init="pytorch").double().eval()
    batch = tiny_batch(b=4)
    with torch.no_grad():
        q0, _ = model.encoder.encode(batch["tokens"], batch["lengths"])
    refined = model.refine.evaluated(model, q0, batch["tokens"], batch["lengths"], torch.Generator().manual_seed(1))
    with torch.no_grad():
        before, after = negative_elbo(model, batch, q0), negative_elbo(model, batch, refined)
    gain = before - after
    assert bool((gain > 0.05).all()), gain  # nats per text; 23-26 here
    decoder = {k: v.clone() for k, v in model.decoder.state_dict().items()}
    assert all(torch.equal(decoder[k], v) for k, v in model.decoder.state_dict().items())  # evaluation leaves θ alone


def test_end_to_end_gradient_equals_finite_differences_in_float64():
    """SPEC §13 check 2: V 20, emb 8, hidden 16, d 4, length 6, K 3, clipping off, float64: the gradient of the
    final loss through the unrolled steps equals central differences of the whole computation."""
    refine = SVIRefinement(steps=3, lr=1.0, clip=float("inf"))
    model = tiny_model(refine, init="pytorch", dropout_in=0.0, dropout_out=0.0, fused_output=False).double()
    batch = tiny_batch(b=3)
    _, grads = loss_and_grads(model, batch)
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(2)
    for name in ("encoder.to_posterior.weight", "encoder.lstm.weight_hh_l0", "decoder.z_to_c0.weight", "decoder.out.weight"):
        p = params[name]
        for _ in range(3):
            i = int(torch.randint(0, p.numel(), (1,), generator=g))
            old, values = p.view(-1)[i].item(), []
            for delta in (1e-6, -1e-6):
                with torch.no_grad():
                    p.view(-1)[i] = old + delta
                torch.manual_seed(3)  # the refinement's inner steps need gradients: no no_grad around the loss
                values.append(float(model.loss_terms(batch, 0.7)["loss"]))
            with torch.no_grad():
                p.view(-1)[i] = old
            numeric = (values[0] - values[1]) / 2e-6
            analytic = float(grads[name].view(-1)[i])
            assert abs(numeric - analytic) <= 1e-7 + 1e-6 * abs(analytic), (name, i, numeric, analytic)


def test_a_binding_clip_scales_the_step_by_a_constant(monkeypatch):
    """The reference clips each step's gradient by min(1, c/‖g‖) taken as a number: with the clip binding, the end-to-end
    gradients equal those of a run whose clip factors are replaced by the same values as Python floats (a factor left
    in the graph would add its own derivative)."""
    from seqvae.core import refinement

    refine = SVIRefinement(steps=3, lr=1.0, clip=0.05)
    model = tiny_model(refine, init="pytorch", dropout_in=0.0, dropout_out=0.0, fused_output=False).double()
    batch, factors, original = tiny_batch(b=3), [], refinement.clip_factor

    def recorded(g, max_norm):
        factors.append(float(original(g, max_norm)))
        return original(g, max_norm)

    monkeypatch.setattr(refinement, "clip_factor", recorded)
    _, grads = loss_and_grads(model, batch)
    assert len(factors) == 6 and max(factors) < 0.5  # two gradients per step, every clip binding
    constants = iter(factors)
    monkeypatch.setattr(refinement, "clip_factor", lambda g, max_norm: next(constants))
    _, as_numbers = loss_and_grads(model, batch)
    for name, g in grads.items():
        assert torch.allclose(g, as_numbers[name], rtol=1e-12, atol=1e-14), name


def test_a_clip_that_never_binds_changes_no_gradient():
    """SPEC §13 check 6: thresholds 10× apart, every step's norm below both: the same gradients (to 1e-6 relative)."""
    grads = []
    for clip in (5.0, 50.0):
        model = tiny_model(SVIRefinement(steps=3, lr=1.0, clip=clip), init="pytorch", dropout_in=0.0, dropout_out=0.0,
                           fused_output=False).double()  # fmt: skip
        record = []
        q, _ = model.encoder.encode(tiny_batch(b=3)["tokens"], tiny_batch(b=3)["lengths"])
        model.refine.path(model, q, tiny_batch(b=3)["tokens"], tiny_batch(b=3)["lengths"], None, 0.7, record=record)
        assert max(float(g.norm()) for step in record for g in step["grads"]) < 5.0
        grads.append(loss_and_grads(model, tiny_batch(b=3))[1])
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-6, atol=1e-12), name


def test_momentum_recursion_on_a_quadratic_and_the_batch_mean_step():
    """SPEC §13 check 3, with the decoder replaced by ½λᵀAλ (clipping off): 10 heavy-ball steps equal the closed-form
    recursion; texts of a batch each move by 1/B of their own gradient (f is a batch mean)."""
    a = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    refine = SVIRefinement(steps=10, lr=1.0, momentum=0.5, clip=float("inf"))
    refine.objective = lambda model, tokens, lengths, inputs, mu, logvar, eps, w: (
        0.5 * ((mu @ a) * mu).sum(-1).mean() + 0 * logvar.sum()
    )
    start = torch.tensor([[1.0, -2.0]] * 4, dtype=torch.float64)
    out = refine.path(None, DiagonalGaussian(start, torch.zeros_like(start)), None, None, None, 1.0)
    lam, p = start[0].clone(), None
    for _ in range(10):
        g = (a @ lam) / 4  # the batch of 4 identical texts: 1/4 of one text's gradient
        p = -g if p is None else 0.5 * p - g
        lam = lam + p
    assert torch.allclose(out.mu, lam.expand(4, 2), rtol=0, atol=1e-12)
    assert torch.equal(out.logvar, torch.zeros_like(start))


def test_a_decoder_that_ignores_z_gets_the_kl_gradient_alone():
    """SPEC §13 check 5: with z cut from the decoder, the first SVI gradient is (w/B)·mu and (w/2B)·(σ² − 1)."""
    model = tiny_model(init="pytorch").double().eval()
    with torch.no_grad():
        model.decoder.z_to_c0.weight.zero_()  # z enters the decoder's initial state and every step's input
        model.decoder.lstm.weight_ih_l0[:, -TINY["latent_dim"] :].zero_()
    batch, w = tiny_batch(b=4), 0.3
    mu = torch.randn(4, 4, dtype=torch.float64)
    logvar = torch.randn(4, 4, dtype=torch.float64)
    record = []
    SVIRefinement(steps=1, clip=float("inf")).path(model, DiagonalGaussian(mu, logvar), batch["tokens"], batch["lengths"],
                                                   None, w, torch.Generator().manual_seed(0), record=record)  # fmt: skip
    g_mu, g_logvar = record[0]["grads"]
    assert torch.allclose(g_mu, w / 4 * mu, rtol=0, atol=1e-12)
    assert torch.allclose(g_logvar, w / 8 * (logvar.exp() - 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("extra", "option"),
    [(["--model.posterior", "seqvae.FullCovGaussianPosterior"], "model.posterior"),
     (["--model.aggressive", "seqvae.AggressiveTraining"], "model.aggressive"),
     (["--model.kl_penalty", "seqvae.FreeBits"], "model.kl_penalty"),
     (["--model.refine.init_args.momentum", "1.0"], "model.refine.init_args.momentum")],
)  # fmt: skip
def test_combinations_that_make_no_sense_are_refused_in_one_line(extra, option):
    from seqvae.cli import SeqVAECLI

    args = [f"--config={REPO / 'configs/demo.yaml'}", f"--config={REPO / 'configs/demo_sa_vae.yaml'}",
            "--data.train=data/demo/train.txt", "--model.embed_dim=8", "--model.hidden_dim=12", *extra]  # fmt: skip
    with pytest.raises(ConfigError, match=f"^{option}"):
        SeqVAECLI(args=args, run=False)


def test_bn_vae_is_refused_with_refinement():
    with pytest.raises(ConfigError, match=r"^model.bn_gamma cannot be combined with model.refine \(SA-VAE\)"):
        SeqVAE(**TINY, bn_gamma=0.6, refine=SVIRefinement())


def test_fit_and_test_end_to_end_through_the_cli(tmp_path):
    """`seqvae fit --config configs/demo.yaml --config configs/demo_sa_vae.yaml` on a tiny corpus: trains through
    the refinement, tests with it (IW-NLL at the refined posteriors), records it in config.yaml; the same with
    model.aggressive is refused in one line and leaves no run directory."""
    words = "the a cat dog sat ran on mat under tree big small red blue".split()
    g = torch.Generator().manual_seed(0)
    for name, n in (("train", 60), ("valid", 20), ("test", 20)):
        lines = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (int(k),), generator=g))
                 for k in torch.randint(2, 7, (n,), generator=g)]  # fmt: skip
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    common = ["--config", str(REPO / "configs/demo.yaml"), "--config", str(REPO / "configs/demo_sa_vae.yaml"),
              "--data.train", str(tmp_path / "train.txt"), "--data.val", str(tmp_path / "valid.txt"),
              "--data.test", str(tmp_path / "test.txt"), "--data.batch_size", "16", "--model.embed_dim", "8",
              "--model.hidden_dim", "12", "--model.latent_dim", "4", "--model.val_iw_samples", "0",
              "--model.test_iw_samples", "3", "--model.refine.init_args.steps", "2", "--trainer.max_epochs", "1",
              "--trainer.limit_train_batches", "2", "--trainer.enable_model_summary", "false",
              "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    run = lambda *a: subprocess.run([sys.executable, "-m", "seqvae", "fit", *common, *a], cwd=tmp_path, env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)  # fmt: skip
    refused = run("--model.aggressive", "seqvae.AggressiveTraining")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "model.aggressive cannot be combined with model.refine (SA-VAE)" in refused.stderr
    assert not (tmp_path / "runs").exists()
    done = run()
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    import yaml

    run_dir = tmp_path / "runs" / "demo_sa_vae" / "version_0"
    m = json.loads((run_dir / "metrics.json").read_text())
    assert 0 < m["test/iw_nll"] <= m["test/loss"] + 0.02 * abs(m["test/loss"]) + 0.1, m  # −ELBO and IW-NLL at λ_K
    refine = yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["refine"]
    assert refine["class_path"].endswith("SVIRefinement") and refine["init_args"]["steps"] == 2


def test_the_python_api_scores_the_refined_posterior():
    """`model.encode/elbo/iw_nll` of an SA-VAE score the posterior after its SVI steps, as `seqvae test` does."""
    from seqvae.text.corpus import Vocabulary

    words = "the a cat dog sat ran on under mat rug big small red".split()
    texts = ["the cat sat on the mat", "a dog ran", "the big dog sat under a red rug", "cat", "small red mat"]
    vocab = Vocabulary.build([words])
    model = tiny_model(SVIRefinement(steps=10), vocab_size=len(vocab), init="pytorch")
    model.vocab = vocab
    scores = {}
    for name, refine in (("refined", model.refine), ("encoder", None)):
        model.refine = refine
        torch.manual_seed(0)
        scores[name] = model.encode(texts)[0], model.elbo(texts), model.iw_nll(texts, n_samples=20)
    (mu_r, elbo_r, iw_r), (mu_e, elbo_e, iw_e) = scores["refined"], scores["encoder"]
    assert not torch.allclose(mu_r, mu_e, atol=1e-3)  # the SVI steps moved the posterior means
    assert float((elbo_e - elbo_r).mean()) > 5.0, (elbo_e, elbo_r)  # and lowered the −ELBO (nats per text)
    assert bool(torch.isfinite(iw_r).all()) and not torch.allclose(iw_r, iw_e, atol=1e-3)  # drawn from the refined q
