"""KL terms and regularisers. All per-sentence quantities are in nats."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seqvae.core.gaussian import DiagonalGaussian
from seqvae.options import NON_NEGATIVE
from seqvae.store.strategies import declares_subclasses


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """KL(N(mu, σ²) ‖ N(0, I)) per dimension, closed form: (B, Z)."""
    return DiagonalGaussian(mu, logvar).kl_terms()


@declares_subclasses
class KLPenalty:
    """Interface: the KL term that enters the training loss, per sentence (B,), from the
    per-dimension KL (B, Z). Reported KL and model selection always use the true KL.
    `per_dimension`: it needs the KL per latent dimension (refused with a posterior without it)."""

    per_dimension = True

    def __call__(self, kl: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def build(self, latent_dim: int, feature_dim: int) -> torch.nn.Module | None:
        """A module the penalty trains beside the VAE (the model keeps it as `penalty_module`, so
        checkpoints hold it: `dual_kl.Critics`); None: none."""
        return None

    def term(self, kl: torch.Tensor, z: torch.Tensor, features: torch.Tensor, module) -> torch.Tensor:
        """The term per sentence (B,): from the KL terms (B, Z) alone, unless the penalty needs the
        batch's draws z (B, Z), the encoder features (B, H) and its `build` module (`DualKL`)."""
        return self(kl)

    # per_text.csv columns of the penalty's own test estimates (DualKL: ("nll_bar",)); `test_batch`
    # returns them per text, and the test's EvalMetrics keeps them beside IW-NLL
    text_columns: tuple[str, ...] = ()

    def test_batch(self, model, batch: dict, q, features: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """Estimates of the penalty's own, logged at test beside the exact metrics (`DualKL`'s);
        returns those of `text_columns` per text (B,), or None."""
        return None


class StandardKL(KLPenalty):
    """The true KL, summed over dimensions."""

    per_dimension = False  # any split of the KL sums to it

    def __call__(self, kl: torch.Tensor) -> torch.Tensor:
        return kl.sum(-1)


class FreeBits(KLPenalty):
    """Li et al. (2019): per example and dimension, KL_d counts only where KL_d > λ = target/Z
    (strict), the mask itself not differentiated. Below λ the gradient is exactly zero.

    Args:
        target: Total free nats over all dimensions (8 in Li et al.); λ = target / Z.
    """

    option_ranges = {"target": NON_NEGATIVE}  # 0: the true KL (KL_d > 0 always counts)

    def __init__(self, target: float = 8.0):
        self.target = target

    def __call__(self, kl: torch.Tensor) -> torch.Tensor:
        threshold = self.target / kl.size(-1)
        return (kl * (kl > threshold).to(kl.dtype)).sum(-1)


class BatchFreeBits(KLPenalty):
    """Kingma et al. (2016): per dimension max(λ, batch-mean KL_d), λ = target/Z. Returned per
    sentence as the batch value (every sentence carries the same term)."""

    option_ranges = {"target": NON_NEGATIVE}  # 0: the true KL (max(0, KL_d) = KL_d)

    def __init__(self, target: float = 8.0):
        self.target = target

    def __call__(self, kl: torch.Tensor) -> torch.Tensor:
        threshold = self.target / kl.size(-1)
        per_dim = kl.mean(0).clamp(min=threshold)  # (Z,)
        return per_dim.sum().expand(kl.size(0))


def mean_pairwise_cosine(h: torch.Tensor) -> torch.Tensor:
    """Mean of cos(h_i, h_j) over ordered pairs i ≠ j of the rows of h (B, H). Needs B ≥ 2."""
    u = F.normalize(h, dim=-1)
    n = u.size(0)
    total = u.sum(0).pow(2).sum()  # Σ_ij cos_ij, diagonal included
    return (total - (u.pow(2).sum(-1)).sum()) / (n * (n - 1))


@declares_subclasses
class Regularizer:
    """Interface: an extra training-loss term from the encoder features h (B, H)."""

    name = "regularizer"

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class CosineDispersion(Regularizer):
    """Long et al. §4.2: add weight · mean pairwise cosine of the batch's encoder features,
    pushing features apart. The paper gives no weight; 0 turns it off.

    Args:
        weight: γ, the multiplier of the mean pairwise cosine.
    """

    name = "cosine"
    # 0: off; a negative weight would pull the features together, the opposite of its purpose.
    option_ranges = {"weight": NON_NEGATIVE}

    def __init__(self, weight: float = 1.0):
        self.weight = weight

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        if features.size(0) < 2:
            return features.new_zeros(())
        return self.weight * mean_pairwise_cosine(features)
