"""WAE-RNF's training-only terms (Wang & Wang 2019; ../shared/SPEC.md §12.3–12.4), options of
`planar_flow.PlanarFlowPosterior`: the MMD between pre-flow posterior samples and N(0, I) with the
paper's two kernels, and the "Riemannian" centres penalty at the input of each flow layer. Neither
enters evaluation (IW-NLL, −ELBO, KL, MI, AU are those of q_K alone).
"""

from __future__ import annotations

from typing import Literal

import torch

from seqvae.options import NON_NEGATIVE, POSITIVE
from seqvae.store.strategies import strategy

# The inverse multiquadratic kernels' scales s: C_s = 2·Z·s (the reference's, for both the MMD
# and the centres penalty).
IMQ_SCALES = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a_i − b_j‖² for rows a (N, Z), b (M, Z): (N, M), from the differences (no cancellation)."""
    return (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1)


def imq_kernel(d2: torch.Tensor, latent_dim: int) -> torch.Tensor:
    """Σ_s C_s / (C_s + ‖a − b‖²), C_s = 2·Z·s, from the squared distances."""
    return sum(2 * latent_dim * s / (2 * latent_dim * s + d2) for s in IMQ_SCALES)


def mmd_imq(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The reference's 'im' MMD (PTB): [Σ_{i≠j} k(x_i, x_j) + Σ_{i≠j} k(y_i, y_j)]/(B(B−1))
    − 2·Σ_{i,j} k(x_i, y_j)/B², unbiased in its first part. 0 for B < 2 (no pairs)."""
    b, z = x.shape
    if b < 2:
        return x.new_zeros(())
    off = 1 - torch.eye(b, dtype=x.dtype, device=x.device)
    same = ((imq_kernel(squared_distances(x, x), z) + imq_kernel(squared_distances(y, y), z)) * off).sum()
    return same / (b * (b - 1)) - 2 * imq_kernel(squared_distances(x, y), z).sum() / (b * b)


def mmd_gaussian(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The reference's 'g' MMD (Yahoo, Yelp): k(a, b) = exp(−10·‖a − b‖²/Z²) (102.4 at Z = 32), the
    mean over all pairs, diagonals included, of k(x, x) + k(y, y) − 2·k(x, y) (biased, ≥ 0)."""
    z = x.size(1)

    def k(a, b):
        return torch.exp(-10 * squared_distances(a, b) / z**2)

    return k(x, x).mean() + k(y, y).mean() - 2 * k(x, y).mean()


MMD_KERNELS = {"im": mmd_imq, "g": mmd_gaussian}


@strategy
class MMDPenalty:
    """The MMD between a FRESH sample x_i ~ q0(z|x_i) of each text's pre-flow posterior and
    y_i ~ N(0, I), one per text. It enters the loss with weight `weight` − w (w the KL weight):
    10 → 9.2 in the reference, which pairs it with a KL weight capped at 0.8.

    Args:
        kernel: "g": the Gaussian kernel (the reference's default, its Yahoo and Yelp runs);
            "im": the inverse multiquadratic sum over 7 scales (its PTB run).
        weight: The reference's `--mmd_w` (10).
    """

    option_ranges = {"weight": NON_NEGATIVE}

    def __init__(self, kernel: Literal["g", "im"] = "g", weight: float = 10.0):
        self.kernel, self.weight = kernel, weight

    def __call__(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        y = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return MMD_KERNELS[self.kernel](x, y)


@strategy
class CentresPenalty:
    """The "Riemannian" penalty (SPEC §12.3): at the input z_{k−1} of each flow layer, with
    m = min_c ‖z_{k−1} − c‖ over fixed centres c,
    - reg "im" (every README run): band·log β, β = Σ_s C_s/(C_s + m²) (C_s = 2·Z·s): minimised,
      it pushes codes AWAY from the nearest centre;
    - reg "g": −log(1 + exp(−band·m²)): minimised, it pulls them TOWARDS it.
    Summed over layers, meaned over texts, weight 1. It changes no transform (the reference's
    division of û by β is commented out).

    The centres are OURS, not the reference's: its `<dataset>_centers.pt` files are made by nothing
    in its repository (most likely k-means centres of an earlier model's codes; not verifiable).
    Our recipe: `count` points drawn from N(0, scale²·I) with their own generator seeded `seed`
    (the global RNG is not touched), scale 0.55 matching the coordinate s.d. of the reference's
    files (≈ 0.5–0.6). They are a buffer of the flow, saved in checkpoints.

    Args:
        reg: "im" or "g", as above.
        band: The reference's 0.5.
        count: Number of centres (the reference's files: 20).
        scale: Standard deviation of each centre coordinate.
        seed: Seed of the centres' generator.
    """

    option_ranges = {"band": NON_NEGATIVE, "count": POSITIVE, "scale": NON_NEGATIVE}

    def __init__(self, reg: Literal["im", "g"] = "im", band: float = 0.5, count: int = 20, scale: float = 0.55, seed: int = 0):
        self.reg, self.band, self.count, self.scale, self.seed = reg, band, count, scale, seed

    def make(self, latent_dim: int) -> torch.Tensor:
        """The centres (count, Z) of this recipe."""
        g = torch.Generator().manual_seed(self.seed)
        return self.scale * torch.randn(self.count, latent_dim, generator=g)

    def __call__(self, inputs: list[torch.Tensor], centres: torch.Tensor) -> torch.Tensor:
        """The penalty per text and sample, (B, K): summed over the layers' inputs (each (B, K, Z))."""
        total = 0
        for z in inputs:
            flat = z.reshape(-1, z.size(-1))
            m2 = squared_distances(flat, centres.to(z.dtype)).min(1).values.reshape(z.shape[:-1])
            if self.reg == "im":
                total = total + self.band * torch.log(imq_kernel(m2, z.size(-1)))
            else:
                total = total - torch.log1p(torch.exp(-self.band * m2))
        return total
