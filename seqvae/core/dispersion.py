"""Feature dispersion (SPEC §6): how a set of vectors (the encoder features, the posterior means)
spreads, from sums that add over batches and DDP processes: the mean pairwise cosine, the
covariance, its spectrum, the share of the variance along the top-k components (EV_k) and the
effective rank. Deterministic: no noise drawn. `EvalMetrics` (`metrics.py`) keeps the sums.
"""

from __future__ import annotations

import torch


def pairwise_cosine_from_sum(unit_sum: torch.Tensor, n: int) -> torch.Tensor:
    """Mean cos(h_i, h_j) over ordered pairs i ≠ j, exactly, from Σ_i h_i/‖h_i‖:
    Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² - N."""
    return (unit_sum.pow(2).sum() - n) / (n * (n - 1))


def covariance_from_sums(total: torch.Tensor, outer: torch.Tensor, n: int) -> torch.Tensor:
    """Sample covariance (divisor N-1) from Σ_i x_i (D,) and Σ_i x_i x_iᵀ (D, D); these sums
    add over chunks and over DDP processes, so no rows need to be kept."""
    return (outer - torch.outer(total, total) / n) / (n - 1)


def spectrum(cov: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of a covariance matrix (the variances along its principal components), largest
    first, in float64; the tiny negative values of rounding are set to 0. All NaN when the
    covariance is not finite (fewer than 2 points)."""
    cov = cov.double()
    if not bool(torch.isfinite(cov).all()):
        return torch.full(cov.shape[:1], float("nan"), dtype=torch.float64, device=cov.device)
    return torch.linalg.eigvalsh(cov).flip(0).clamp_min(0)


def explained_variance(cov: torch.Tensor, k: int) -> torch.Tensor:
    """EV_k = Σ_{i≤k} λ_i / Σ_i λ_i, the share of the total variance along the top-k principal
    components (λ the covariance eigenvalues, largest first) as the IsoBN paper (Zhou et al.
    2021, §5.3) measures isotropy: 1 when the points lie on a k-dim subspace, k/D when isotropic.
    NaN when there is no variance at all."""
    return explained_variance_of(spectrum(cov), k)


def effective_rank(cov: torch.Tensor) -> torch.Tensor:
    """Effective rank of Roy & Vetterli (2007), "The effective rank: a measure of effective
    dimensionality" (EUSIPCO): exp(H(p)) with p_i = λ_i / Σ_j λ_j the normalised covariance
    eigenvalues and H the Shannon entropy in nats (0 log 0 = 0). It is 1 for a rank-1 covariance,
    D for an isotropic one and lies in [1, rank]. NaN when there is no variance at all."""
    return effective_rank_of(spectrum(cov))


def explained_variance_of(lam: torch.Tensor, k: int) -> torch.Tensor:
    """`explained_variance` from the eigenvalues `lam` (largest first, `spectrum`), which EvalMetrics computes once."""
    total = lam.sum()
    return lam[:k].sum() / total if total > 0 else torch.full((), float("nan"), dtype=lam.dtype, device=lam.device)


def effective_rank_of(lam: torch.Tensor) -> torch.Tensor:
    """`effective_rank` from the eigenvalues `lam` (`spectrum`)."""
    total = lam.sum()
    if not total > 0:
        return torch.full((), float("nan"), dtype=lam.dtype, device=lam.device)
    p = lam / total
    return torch.exp(-torch.special.xlogy(p, p).sum())
