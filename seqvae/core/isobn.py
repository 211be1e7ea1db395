"""IsoBN (Zhou et al. 2021, `../shared/papers/004_62100ba901817c33.txt` §4.2) on encoder features,
before the posterior layer, with either encoder (`model.feature_norm`, configs/transformer/isobn.yaml).

Per feature dimension i, from moving estimates of the features' covariance C and standard
deviations s (momentum m, updated from each training batch, centred on its own mean):

    ρ = clip(C / (s sᵀ), −1, 1)        γ_i = mean_j ρ_ij²      (∝ the size of i's correlated group)
    a_i = (γ_i s_i + ε)^(−β)           a ← a · √(Σ_i C_ii / Σ_i C_ii a_i²)   (total variance kept)
    output = h · a                     (a is a constant to the gradient)

so a dimension in a large correlated group (a dominating direction) or with a large spread is
damped; β sets the strength (β = 1/2 as the authors' defaults). Read against the authors' code
(INK-USC/IsoBN, model.py): as there, the output is the input scaled, not centred, although the
paper's text speaks of removing the mean (the mean is removed from the statistics only); and
m = 0.05, ε = 1e-3, β = 0.5 are its defaults. One deviation: the statistics start at zero there,
which makes the first evaluation before any training batch NaN (0/0); here the norm is the
identity until it has seen a batch. The statistics are float64 buffers (saved in checkpoints).
"""

from __future__ import annotations

import torch
from torch import nn

from seqvae.options import NON_NEGATIVE, POSITIVE, Range, check_strategy
from seqvae.store.strategies import strategy


@strategy
class IsoBN:
    """Settings of IsoBN: strength `beta`, `momentum` of the moving statistics, `eps`."""

    option_ranges = {"beta": NON_NEGATIVE, "eps": POSITIVE, "momentum": Range(lambda v: 0 < v <= 1, "in (0, 1]")}

    def __init__(self, beta: float = 0.5, momentum: float = 0.05, eps: float = 1e-3):
        self.beta, self.momentum, self.eps = beta, momentum, eps

    def build(self, feature_dim: int) -> IsoBNorm:
        check_strategy("model.feature_norm", self)
        return IsoBNorm(feature_dim, self.beta, self.momentum, self.eps)

    def __repr__(self) -> str:
        return f"IsoBN(beta={self.beta}, momentum={self.momentum}, eps={self.eps})"


class IsoBNorm(nn.Module):
    def __init__(self, dim: int, beta: float, momentum: float, eps: float):
        super().__init__()
        self.beta, self.momentum, self.eps = beta, momentum, eps
        f64 = {"dtype": torch.float64}
        self.register_buffer("cov", torch.zeros(dim, dim, **f64))
        self.register_buffer("std", torch.zeros(dim, **f64))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, h: torch.Tensor) -> None:
        x = h.detach().double()
        y = x - x.mean(0)
        self.cov += self.momentum * (y.T @ y / x.size(0) - self.cov)
        self.std += self.momentum * ((y**2).mean(0).sqrt() - self.std)
        self.batches += 1

    @torch.no_grad()
    def scale(self) -> torch.Tensor:
        """The per-dimension factor a (D,) from the moving statistics."""
        outer = torch.outer(self.std, self.std)
        corr = torch.where(outer > 0, self.cov / outer.clamp_min(torch.finfo(torch.float64).tiny), 0.0).clamp(-1, 1)
        gamma = (corr**2).mean(1)
        a = (gamma * self.std + self.eps) ** -self.beta
        var = torch.diagonal(self.cov)
        return a * (var.sum() / ((var * a**2).sum() + self.eps)).sqrt()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.update(h)
        if int(self.batches) == 0:
            return h
        return h * self.scale().to(h.dtype)
