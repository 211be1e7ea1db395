"""The diagonal Gaussian's densities: log N(z; mu, diag σ²) and reparameterised draws, which
`posteriors.py` builds its families on (`metrics.py` re-exports them under their old names).
"""

from __future__ import annotations

import math

import torch

LOG_2PI = math.log(2 * math.pi)


def log_normal(z: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, diag σ²) with its constant. z (B, K, Z), mu/logvar (B, Z) -> (B, K)."""
    mu, logvar = mu.unsqueeze(1), logvar.unsqueeze(1)
    return -0.5 * (((z - mu) ** 2) / logvar.exp() + logvar + LOG_2PI).sum(-1)


def log_standard_normal(z: torch.Tensor) -> torch.Tensor:
    return -0.5 * (z**2 + LOG_2PI).sum(-1)


def sample_posterior(mu: torch.Tensor, logvar: torch.Tensor, k: int, generator=None) -> torch.Tensor:
    """z = mu + σ·ε: (B, K, Z)."""
    eps = torch.randn((mu.size(0), k, mu.size(1)), generator=generator, device=mu.device, dtype=mu.dtype)
    return mu.unsqueeze(1) + (0.5 * logvar).exp().unsqueeze(1) * eps


class ExactDensity:
    """The part of the posterior interface a family with an exact, sampleable density shares: `draw`
    (a draw and its log q, IW-NLL's weights) and `base` (what AU and MI measure: the distribution
    itself). A flow overrides both (its log q needs the pre-flow z; its base is the pre-flow Gaussian).
    `shared_params`: the indices of `params()` that every text has in common (not one row per text)."""

    shared_params: tuple[int, ...] = ()

    def draw(self, k: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.sample(k, generator)
        return z, self.log_prob(z)

    @property
    def base(self):
        return self


class DiagonalGaussian(ExactDensity):
    """q(z|x) = N(mu, diag σ²) for a batch of texts (`GaussianPosterior`): mu, logvar (B, Z).

    The interface every posterior's batch object has (`posteriors.py`): `mean` (B, Z), `params()`,
    `sample(k)` (B, K, Z) reparameterised, `log_prob(z)` (B, K), `draw(k)` (z and log q), `base`, `kl()` (B,) against N(0, I),
    `kl_terms()` (what a KL penalty gets: per dimension here), `marginal_kl()` (B, Z), `neg_entropy()`
    (B,), `double()`, `rows()`/`from_rows()` (the per-text parameters a dataset pool keeps) and
    `log_mixture(z, kernel)` (the cross-densities of MI, through the diagonal-mixture `kernel`)."""

    per_dimension_kl = True

    def __init__(self, mu: torch.Tensor, logvar: torch.Tensor):
        self.mu, self.logvar = mu, logvar

    @property
    def mean(self) -> torch.Tensor:
        return self.mu

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu, self.logvar

    def with_mean(self, mean: torch.Tensor) -> DiagonalGaussian:
        return DiagonalGaussian(mean, self.logvar)

    def sample(self, k: int, generator=None) -> torch.Tensor:
        return sample_posterior(self.mu, self.logvar, k, generator)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        return log_normal(z, self.mu, self.logvar)

    def kl_terms(self) -> torch.Tensor:
        """KL(N(mu, σ²) ‖ N(0, I)) per dimension, closed form: (B, Z) (`losses.gaussian_kl`)."""
        return 0.5 * (self.mu.pow(2) + self.logvar.exp() - self.logvar - 1.0)

    def kl(self) -> torch.Tensor:
        return self.kl_terms().sum(-1)

    def marginal_kl(self) -> torch.Tensor:
        mu, lv = self.mu, self.logvar
        return 0.5 * (mu**2 + lv.exp() - 1 - lv)

    def neg_entropy(self) -> torch.Tensor:
        return -0.5 * self.mu.size(1) * LOG_2PI - 0.5 * (1 + self.logvar).sum(-1)

    def double(self) -> DiagonalGaussian:
        return DiagonalGaussian(self.mu.double(), self.logvar.double())

    def rows(self) -> torch.Tensor:
        return torch.cat([self.mu, self.logvar], dim=-1)

    def from_rows(self, rows: torch.Tensor) -> DiagonalGaussian:
        mu, logvar = rows.chunk(2, dim=-1)
        return DiagonalGaussian(mu.contiguous(), logvar.contiguous())

    def log_mixture(self, z: torch.Tensor, kernel, max_elements: int) -> torch.Tensor:
        return kernel(z, self.mu, self.logvar, max_elements)
