"""The posterior q(z|x) as a strategy (`model.posterior`): everything that knows its family.

A `Posterior` builds the layer from the encoder's features to its parameters (`layer`, the
encoder's `to_posterior`) and turns that layer's output into a batch object (`distribution`)
that draws z (K reparameterised samples), scores log q(z|x), gives the KL the loss uses (closed
form here; a family without one would average log q − log p over its own samples), the means AU
and BN-VAE use, and the cross-densities MI needs. Training, IW-NLL, −ELBO, MI, AU, scoring,
generation and the probe ask that object; none of them knows the family.

- `GaussianPosterior` (the default): N(mu, diag σ²), He et al.'s (`gaussian.DiagonalGaussian`).
- `FullCovGaussianPosterior`: iVAE's released encoder (Fang et al. 2019; SPEC §11.1),
  z = W·[h; ε] + b, ε ~ N(0, I): with W = [A | L], q(z|x) = N(A·h + b, L Lᵀ), one full
  covariance for every text (`FullCovGaussian`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqvae.core.gaussian import LOG_2PI, DiagonalGaussian, ExactDensity
from seqvae.errors import ConfigError
from seqvae.store.strategies import declares_subclasses


@declares_subclasses
class Posterior:
    """Interface: a family of posteriors. `per_dimension_kl`: its KL is a sum over latent
    dimensions (what the free-bits penalties need); a family whose dimensions are coupled says
    False and such a penalty is refused with it (`check_penalty`). Subclasses declare themselves
    (checkpoints may carry them; configs name them `class_path: seqvae.<Name>`)."""

    per_dimension_kl = True
    bn_vae = True  # BN-VAE's norm (model.bn_gamma) may act on its means (`with_mean`)
    checks: tuple = ()  # `eval_checks.EvalCheck` classes the model brings for this family (each says if it applies)

    def layer(self, feature_dim: int, latent_dim: int) -> nn.Module:
        raise NotImplementedError

    def distribution(self, layer: nn.Module, h: torch.Tensor):
        """The batch's posteriors from features h (B, H), in fp32 (the densities need more than
        bf16's 3 significant digits; a no-op in fp32)."""
        raise NotImplementedError

    def training_terms(self, q, kl_weight: float) -> dict:
        """The family's own training-loss terms besides rec + w·KL, by name (none here;
        `planar_flow.PlanarFlowPosterior`: WAE-RNF's MMD and centres penalty)."""
        return {}

    def check_penalty(self, kl_penalty) -> None:
        if not self.per_dimension_kl and getattr(kl_penalty, "per_dimension", False):
            raise ConfigError(
                f"model.kl_penalty: {type(kl_penalty).__name__} needs the KL per latent dimension, which "
                f"model.posterior {type(self).__name__} does not have (its dimensions are correlated): use StandardKL"
            )


class GaussianPosterior(Posterior):
    """N(mu(x), diag σ²(x)) from one bias-free linear layer H -> 2Z (mu, log σ²), as He et al."""

    def layer(self, feature_dim: int, latent_dim: int) -> nn.Module:
        return nn.Linear(feature_dim, 2 * latent_dim, bias=False)

    def distribution(self, layer: nn.Module, h: torch.Tensor) -> DiagonalGaussian:
        out = layer(h)
        mu, logvar = out.to(torch.promote_types(out.dtype, torch.float32)).chunk(2, dim=-1)  # float64 stays
        return DiagonalGaussian(mu, logvar)


class FullCovGaussianPosterior(Posterior):
    """iVAE's encoder (SPEC §11.1): one Linear(H + Z -> Z, with bias) on [h; ε], ε ~ N(0, I),
    i.e. q(z|x) = N(A·h + b, L Lᵀ) with [A | L] its weight: a full covariance shared by all texts.
    Its KL does not split over dimensions, so the free-bits penalties are refused with it."""

    per_dimension_kl = False

    def layer(self, feature_dim: int, latent_dim: int) -> nn.Module:
        return nn.Linear(feature_dim + latent_dim, latent_dim)

    def distribution(self, layer: nn.Module, h: torch.Tensor) -> FullCovGaussian:
        z = layer.out_features
        mu = F.linear(h, layer.weight[:, :-z], layer.bias).float()
        return FullCovGaussian(mu, layer.weight[:, -z:].float())


class FullCovGaussian(ExactDensity):
    """q(z|x) = N(mu(x), L Lᵀ) for a batch: mu (B, Z), L (Z, Z) the same for every text; the
    interface of `gaussian.DiagonalGaussian`. Densities through the whitened L⁻¹(z − mu); log|det L|
    by LU in float64 (an L near singularity makes the KL huge, as it should)."""

    per_dimension_kl = False
    shared_params = (1,)  # L: one covariance factor for all texts

    def __init__(self, mu: torch.Tensor, L: torch.Tensor):
        self.mu, self.L = mu, L

    @property
    def mean(self) -> torch.Tensor:
        return self.mu

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.mu, self.L

    def with_mean(self, mean: torch.Tensor) -> FullCovGaussian:
        return FullCovGaussian(mean, self.L)

    def log_det(self) -> torch.Tensor:
        return torch.linalg.slogdet(self.L.double()).logabsdet.to(self.L.dtype)

    def whiten(self, x: torch.Tensor) -> torch.Tensor:
        """L⁻¹ x for every row x (..., Z)."""
        flat = x.reshape(-1, x.size(-1))
        return torch.linalg.solve(self.L, flat.T).T.reshape(x.shape)

    def sample(self, k: int, generator=None) -> torch.Tensor:
        mu = self.mu
        eps = torch.randn((mu.size(0), k, mu.size(1)), generator=generator, device=mu.device, dtype=mu.dtype)
        return mu.unsqueeze(1) + eps @ self.L.T

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        u = self.whiten(z - self.mu.unsqueeze(1))
        return -0.5 * (u.pow(2).sum(-1) + self.mu.size(1) * LOG_2PI) - self.log_det()

    def kl(self) -> torch.Tensor:
        """½(‖L‖_F² + ‖mu‖² − Z) − log|det L| per text: (B,)."""
        return 0.5 * (self.L.pow(2).sum() + self.mu.pow(2).sum(-1) - self.mu.size(1)) - self.log_det()

    def kl_terms(self) -> torch.Tensor:
        return self.kl().unsqueeze(-1)  # (B, 1): one term, not one per dimension

    def marginal_kl(self) -> torch.Tensor:
        """KL(q(z_d|x) ‖ N(0, 1)) of each dimension's marginal N(mu_d, Σ_dd): (B, Z). Their sum
        is below the KL by the total correlation of q."""
        var = self.L.pow(2).sum(1)
        return 0.5 * (self.mu**2 + var - 1 - var.log())

    def neg_entropy(self) -> torch.Tensor:
        z = self.mu.size(1)
        return (-0.5 * z * (1 + LOG_2PI) - self.log_det()).expand(self.mu.size(0))

    def double(self) -> FullCovGaussian:
        return FullCovGaussian(self.mu.double(), self.L.double())

    def rows(self) -> torch.Tensor:
        return self.mu

    def from_rows(self, rows: torch.Tensor) -> FullCovGaussian:
        return FullCovGaussian(rows, self.L.to(rows.dtype))

    def log_mixture(self, z: torch.Tensor, kernel, max_elements: int) -> torch.Tensor:
        """log (1/M) Σ_j N(z_i; mu_j, L Lᵀ): the unit-variance mixture of the whitened means at the
        whitened z (L⁻¹(z_i − mu_j) = L⁻¹z_i − L⁻¹mu_j), less log|det L|."""
        mu = self.whiten(self.mu)
        return kernel(self.whiten(z), mu, torch.zeros_like(mu), max_elements) - self.log_det()


__all__ = ["FullCovGaussianPosterior", "GaussianPosterior", "Posterior"]
