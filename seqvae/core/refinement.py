"""SA-VAE (Kim et al. 2018, as He et al. re-implement it; SPEC §13): `model.refine`, the encoder's
(mu, log σ²) refined per batch by SVI steps and trained end to end through them.

The inner objective is the batch's mean negative ELBO, f(λ) = (1/B)·Σ_i [CE(x_i, mu_i + σ_i⊙ε_k,i)
+ w·KL(λ_i)], one ε per text per step, drawn before the step. Each step clips the mu-part and the
log σ²-part of ∇_λ f SEPARATELY to L2 norm `clip` over the batch, then takes a heavy-ball step:
p_0 = −g_0, p_k = m·p_{k−1} − g_k, λ_{k+1} = λ_k + lr·p_k. Because f is a batch mean, each text
moves by lr/B times its own gradient and the clip couples the texts of a batch (SPEC §13.2):
results depend on the batch, so evaluation keeps the reference's batches of 32.

Training: the loss is rec + w·KL at λ_K (one fresh z); the encoder gets only dL/dλ_0 through the
K steps and the decoder its direct gradient plus its effect on the path. The gradient is exact:
autograd through the unrolled steps (double backward, `create_graph`), with the clip factors
held constant as the reference's maths does. Why not the reference's finite differences: they
carry ~1 % relative error in fp32 (r = 1e-5), and the reference mixes gradients clipped in
different ways inside them (SPEC §13.6: once the joint norm passes 5 the encoder's "meta-gradient"
is a clipped SVI gradient); double backward has neither, and keeps the K inner graphs instead of
K copies of the decoder's gradient. The inner steps decode through plain logits (the fused output
layer has no second derivative) and, on CUDA, without cuDNN's LSTM (no double backward there).

Evaluation (SPEC §13.5): the same K steps with w = 1, from the pass's own `svi` noise stream;
−ELBO, KL, MI, AU and IW-NLL are all taken at λ_K. IW-NLL: the batch is refined ONCE and all K
importance samples drawn from q(λ_K) — the valid cheaper variant of §13.5 (the reference
re-runs the refinement for every 2 samples, a mixture of 250 proposals per text).
"""

from __future__ import annotations

import contextlib

import torch

from seqvae.core import elbo
from seqvae.core.gaussian import DiagonalGaussian
from seqvae.errors import ConfigError
from seqvae.options import NON_NEGATIVE, POSITIVE, Range
from seqvae.store.strategies import strategy


def clip_factor(g: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The reference's clip coefficient min(1, max_norm / (‖g‖ + 1e-6)), a constant (no gradient)."""
    return (max_norm / (g.detach().norm() + 1e-6)).clamp(max=1.0)


@contextlib.contextmanager
def twice_differentiable(decoder, device: torch.device):
    """The decoder's plain-logits path, and no cuDNN LSTM, while inner steps are built for double backward."""
    fused = decoder.fused_output
    decoder.fused_output = False
    try:
        with torch.backends.cudnn.flags(enabled=False) if device.type == "cuda" else contextlib.nullcontext():
            yield
    finally:
        decoder.fused_output = fused


@strategy
class SVIRefinement:
    """SA-VAE's refinement of the posterior by SVI steps (SPEC §13; He et al.'s defaults).

    Args:
        steps: SVI steps per batch (10; Kim et al.'s own default is 20). 0: plain training, bit for bit.
        lr: Step size α of both parts (1.0).
        momentum: Heavy-ball momentum m (0.5).
        clip: L2 norm over the batch to which the mu- and the log σ²-gradient are each clipped
            before a step (5); .inf: no clipping.
    """

    option_ranges = {
        "steps": NON_NEGATIVE,
        "lr": POSITIVE,
        "momentum": Range(lambda v: 0 <= v < 1, "in [0, 1)"),
        "clip": Range(POSITIVE.ok, "> 0 (.inf: no clipping)"),
    }

    def __init__(self, steps: int = 10, lr: float = 1.0, momentum: float = 0.5, clip: float = 5.0):
        self.steps, self.lr, self.momentum, self.clip = steps, lr, momentum, clip

    def check(self, hparams) -> SVIRefinement:
        """Refuses, in one line naming the option, what the refinement cannot or should not combine with
        (`hparams`: the model's arguments)."""
        posterior, aggressive, kl_penalty = hparams.get("posterior"), hparams.get("aggressive"), hparams.get("kl_penalty")
        reasons = {
            "model.latent_dim 0": "the language model has no posterior to refine" if hparams["latent_dim"] == 0 else None,
            "model.posterior": f"{type(posterior).__name__} is not the diagonal Gaussian the SVI steps update"
            if posterior is not None and type(posterior).__name__ != "GaussianPosterior"
            else None,
            "model.aggressive": "aggressive training and SA-VAE are two different fixes of the encoder"
            if aggressive is not None
            else None,
            "model.bn_gamma": "BN-VAE's bound holds for the encoder's means, which the SVI steps then move away from"
            if hparams["bn_gamma"] is not None
            else None,
            "model.kl_penalty": f"{type(kl_penalty).__name__}: the SVI steps refine the ELBO with the true KL"
            if kl_penalty is not None and type(kl_penalty).__name__ != "StandardKL"
            else None,
        }
        for option, reason in reasons.items():
            if reason:
                raise ConfigError(f"{option} cannot be combined with model.refine (SA-VAE): {reason}")
        return self

    def objective(self, model, tokens, lengths, inputs, mu, logvar, eps, kl_weight) -> torch.Tensor:
        """f(λ) of one step: the batch's mean of CE(x, mu + σ⊙eps) + w·KL(mu, logvar)."""
        z = (mu + (0.5 * logvar).exp() * eps).unsqueeze(1)
        return elbo.elbo_terms(model.decoder, DiagonalGaussian(mu, logvar), tokens, lengths, inputs, z).neg_elbo(kl_weight).mean()

    def path(self, model, q, tokens, lengths, inputs, kl_weight, generator=None, create_graph=False, record=None):
        """λ_0 = q's (mu, logvar) through `steps` SVI steps; returns q(λ_K). `create_graph`: λ_K
        differentiable in λ_0 and the decoder (training); else each λ_k is a fresh leaf.
        `record` (a list): per step, f(λ_k) and the clipped gradients (the pins)."""
        mu, logvar = q.params()
        velocity = None
        for _ in range(self.steps):
            eps = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
            if not create_graph:
                mu, logvar = mu.detach().requires_grad_(), logvar.detach().requires_grad_()
            f = self.objective(model, tokens, lengths, inputs, mu, logvar, eps, kl_weight)
            grads = torch.autograd.grad(f, (mu, logvar), create_graph=create_graph)
            if self.clip != float("inf"):
                grads = [g * clip_factor(g, self.clip) for g in grads]
            velocity = [-g for g in grads] if velocity is None else [self.momentum * v - g for v, g in zip(velocity, grads)]
            mu, logvar = mu + self.lr * velocity[0], logvar + self.lr * velocity[1]
            if record is not None:
                record.append({"f": f.detach(), "grads": [g.detach() for g in grads], "params": (mu.detach(), logvar.detach())})
        return DiagonalGaussian(mu if create_graph else mu.detach(), logvar if create_graph else logvar.detach())

    def refined(self, model, q, tokens, lengths, inputs, kl_weight) -> DiagonalGaussian:
        """Training: q(λ_K), differentiable end to end (double backward); noise from the global generator."""
        if self.steps == 0:
            return q
        with twice_differentiable(model.decoder, tokens.device):
            return self.path(model, q, tokens, lengths, inputs, kl_weight, create_graph=True)

    def evaluated(self, model, q, tokens, lengths, generator) -> DiagonalGaussian:
        """Evaluation: q(λ_K) at w = 1, from `generator` (the pass's `svi` stream). Lightning evaluates
        under inference mode, whose tensors cannot enter autograd: the steps run outside it on copies."""
        if self.steps == 0:
            return q
        with torch.inference_mode(False), torch.enable_grad():
            mu, logvar = (t.clone() for t in q.params())
            q = self.path(model, DiagonalGaussian(mu, logvar), tokens.clone(), lengths.clone(), None, 1.0, generator)
        return q


__all__ = ["SVIRefinement"]
