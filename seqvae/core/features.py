"""What every encoder shares: the features pooled over time from its outputs (Long et al.;
padding-aware) and the posterior layer on them (`posteriors.py`'s family), with BN-VAE's norm on the means.

Shapes: outputs h (B, T, H); mask (B, T) true on real steps; lengths (B,); features (B, H);
the posteriors' means (B, Z).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# "cls": the Transformer encoder's feature at `<s>` (its [CLS]); an LSTM has no such feature.
Pooling = Literal["last", "avg", "max", "abs", "cls"]


# Every pooling sees all real steps (incl. `<s>` and `</s>`) and never padding. The LSTM runs
# forward only, so outputs at real steps do not depend on the padding after them.
def last_pool(h: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return h[torch.arange(h.size(0), device=h.device), lengths - 1]


def avg_pool(h: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return (h * mask.unsqueeze(-1)).sum(1) / lengths.unsqueeze(-1).to(h.dtype)


def max_pool(h: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    return h.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(1)


def abs_pool(h: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per dimension, the value of largest magnitude, sign kept (first step on ties)."""
    magnitude = h.abs().masked_fill(~mask.unsqueeze(-1), -1.0)
    index = magnitude.argmax(1, keepdim=True)  # argmax returns the first maximal index
    return h.gather(1, index).squeeze(1)


POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "last": last_pool,
    "avg": avg_pool,
    "max": max_pool,
    "abs": abs_pool,
}


Init = Literal["reference", "pytorch"]


def bn_vae_norm(latent_dim: int, bn_gamma: float | None, bn_eps: float) -> nn.BatchNorm1d | None:
    """BN-VAE: per dimension, the batch of means has variance γ² (fixed, not learned) and a
    learned mean β, so E_batch[mu_d²] = γ²·v/(v+ε) + β² and E[KL] ≥ Z·γ²/2 while the batch
    variance v of the raw means stays ≫ ε (BatchNorm's eps, 1e-5 by default, as in Zhu et al.'s
    code). Below ε the bound fades: the encoder can escape it that way. None: off."""
    if bn_gamma is None:
        return None
    norm = nn.BatchNorm1d(latent_dim, eps=bn_eps)
    nn.init.constant_(norm.weight, bn_gamma)
    nn.init.zeros_(norm.bias)
    norm.weight.requires_grad_(False)
    return norm


def posterior_of(encoder: nn.Module, h: torch.Tensor):
    """The posterior layer every encoder shares: features h (B, H) -> the batch's posteriors
    (`encoder.posterior`'s family, from its layer `encoder.to_posterior`) and h, with BN-VAE's
    norm on their means when `encoder.mean_norm` is set."""
    norm = getattr(encoder, "feature_norm", None)  # IsoBN (`isobn.py`): what the posterior layer and the metrics see
    if norm is not None:
        h = norm(h)
    # fp32 from here on under bf16 autocast: the densities (KL, log q(z|x), IW weights) need
    # more than bf16's 3 significant digits. No-ops in fp32.
    q = encoder.posterior.distribution(encoder.to_posterior, h)
    h = h.float()
    if encoder.mean_norm is None:
        return q, h
    mu, bn = q.mean, encoder.mean_norm
    if encoder.training and mu.size(0) == 1:
        # Equal-length bucketing makes some training batches a single sentence, whose
        # batch variance does not exist (BatchNorm raises). Such a batch is normalised
        # with the running statistics, which it leaves unchanged, as at evaluation.
        mu = F.batch_norm(mu, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.0, bn.eps)
    else:
        mu = bn(mu)
    return q.with_mean(mu), h


class PosteriorEncoder(nn.Module):
    """What every encoder network shares: `encode` gives the batch's posteriors (the strategy
    `self.posterior`) and features; calling it gives the posterior's parameters (mu first) and h."""

    def encode(self, tokens: torch.Tensor, lengths: torch.Tensor):
        return posterior_of(self, self.features(tokens, lengths))

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor):
        q, h = self.encode(tokens, lengths)
        return (*q.params(), h)
