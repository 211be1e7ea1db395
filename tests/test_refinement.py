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
    assert bool((gain > 0.05).all()), gain  # nats per text; ~0.3-1.6 here
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
