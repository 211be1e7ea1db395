"""Collapse metrics (SPEC §6). Units: nats per sentence unless named otherwise; perplexities are
per predicted token (the n words and `</s>`; `<s>` is never predicted).

Everything that accumulates over an evaluation set lives in one torchmetrics `Metric`
(`EvalMetrics`) whose states are sums or concatenations, so a DDP run reduces them across
processes and gets the whole-set values, and one pass over the data computes every metric.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torchmetrics import Metric

LOG_2PI = math.log(2 * math.pi)
MI_DATASET_SAMPLES = 10


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


LogLikelihood = Callable[[torch.Tensor], torch.Tensor]  # z (B, K, Z) -> log p(x | z) (B, K)


def iw_log_weights(
    log_likelihood: LogLikelihood, mu: torch.Tensor, logvar: torch.Tensor, n_samples: int, chunk: int, generator=None
) -> torch.Tensor:
    """log w_k = log p(x|z_k) + log p(z_k) - log q(z_k|x) for K samples, decoded `chunk` samples
    at a time (the decoder batch is B·chunk sequences): (B, K). All K·B·Z noise values are drawn
    at once, so the samples (and the estimate) do not depend on `chunk`."""
    z_all = sample_posterior(mu, logvar, n_samples, generator)  # (B, K, Z)
    out = []
    for start in range(0, n_samples, chunk):
        z = z_all[:, start : start + chunk]
        out.append(log_likelihood(z) + log_standard_normal(z) - log_normal(z, mu, logvar))
    return torch.cat(out, dim=1)


def iw_nll(
    log_likelihood: LogLikelihood, mu: torch.Tensor, logvar: torch.Tensor, n_samples: int, chunk: int, generator=None
) -> torch.Tensor:
    """Importance-weighted NLL estimate per sentence: -(logsumexp_k log w_k - log K), (B,).
    The encoder runs once; the K samples are batched with the sentences."""
    log_w = iw_log_weights(log_likelihood, mu, logvar, n_samples, chunk, generator)
    return -(torch.logsumexp(log_w, dim=1) - math.log(n_samples))


def mutual_information(
    mu: torch.Tensor, logvar: torch.Tensor, generator=None, samples: int = 1, chunk: int = 1024
) -> torch.Tensor:
    """I(x; z) = E[-H(q(z|x))] - E[log q(z)] with the aggregate posterior q(z) the mixture of the
    M posteriors given (He et al.'s estimator; the pool is whatever rows are passed), from
    `samples` z per posterior (He et al.: 1). Bounded above by log M. More samples leave the
    expectation unchanged and cut the Monte-Carlo noise of the second term by √samples."""
    m, nz = mu.shape
    neg_entropy = (-0.5 * nz * LOG_2PI - 0.5 * (1 + logvar).sum(-1)).mean()
    z = sample_posterior(mu, logvar, samples, generator).reshape(m * samples, nz)  # (M·S, Z)
    log_qz = torch.cat(
        # log q(z_i) = logsumexp_j log N(z_i; mu_j, σ_j²) - log M; rows of z in chunks, O(M²SZ).
        [
            torch.logsumexp(log_normal(z[s : s + chunk].unsqueeze(0).expand(m, -1, -1), mu, logvar), dim=0)
            for s in range(0, m * samples, chunk)
        ]
    ) - math.log(m)
    return neg_entropy - log_qz.mean()


def active_units(mu_sum: torch.Tensor, mu_sq_sum: torch.Tensor, n: int, threshold: float = 0.01) -> torch.Tensor:
    """Number of dimensions whose posterior mean varies over the data: Var_x(E_q[z_d]) (divisor
    N-1) ≥ threshold, from float64 sums so that the set can be fed in any chunks."""
    var = (mu_sq_sum - mu_sum**2 / n) / (n - 1)
    return (var >= threshold).sum()


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
    return _explained_variance(spectrum(cov), k)


def effective_rank(cov: torch.Tensor) -> torch.Tensor:
    """Effective rank of Roy & Vetterli (2007), "The effective rank: a measure of effective
    dimensionality" (EUSIPCO): exp(H(p)) with p_i = λ_i / Σ_j λ_j the normalised covariance
    eigenvalues and H the Shannon entropy in nats (0 log 0 = 0). It is 1 for a rank-1 covariance,
    D for an isotropic one and lies in [1, rank]. NaN when there is no variance at all."""
    return _effective_rank(spectrum(cov))


def _explained_variance(lam: torch.Tensor, k: int) -> torch.Tensor:
    total = lam.sum()
    return lam[:k].sum() / total if total > 0 else torch.full((), float("nan"), dtype=lam.dtype, device=lam.device)


def _effective_rank(lam: torch.Tensor) -> torch.Tensor:
    total = lam.sum()
    if not total > 0:
        return torch.full((), float("nan"), dtype=lam.dtype, device=lam.device)
    p = lam / total
    return torch.exp(-torch.special.xlogy(p, p).sum())


class EvalMetrics(Metric):
    """Every evaluation metric in one pass.

    `update` takes per-sentence reconstruction (summed cross-entropy) and KL, the number of
    predicted tokens, the posterior (mu, logvar), the encoder features and, optionally,
    the per-sentence IW-NLL. MI per batch (`mi`) uses each update's rows as the pool, weighted
    by batch size; `mi_dataset` pools the whole set (stored, computed once at the end).
    The spectrum of the encoder features and of the posterior means (`feature_ev1`, `_ev3`,
    `_erank`, and `mu_…`: EV_k for each k in `ev_ks`, effective rank) comes from their sums and
    sums of outer products: deterministic, no noise drawn.
    """

    full_state_update = False

    def __init__(self, latent_dim: int, feature_dim: int, mi_dataset: bool = True, seed: int = 0, ev_ks=(1, 3)):
        super().__init__()
        self.latent_dim, self.with_mi_dataset, self.seed, self.ev_ks = latent_dim, mi_dataset, seed, tuple(ev_ks)
        f64 = dict(dtype=torch.float64)
        for name in ("n", "tokens", "rec", "kl", "iw_n", "iw", "mi"):
            self.add_state(name, torch.zeros((), **f64), dist_reduce_fx="sum")
        self.add_state("mu_sum", torch.zeros(latent_dim, **f64), dist_reduce_fx="sum")
        self.add_state("mu_sq_sum", torch.zeros(latent_dim, **f64), dist_reduce_fx="sum")
        self.add_state("unit_sum", torch.zeros(feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("feature_sum", torch.zeros(feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("feature_outer", torch.zeros(feature_dim, feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("mu_outer", torch.zeros(latent_dim, latent_dim, **f64), dist_reduce_fx="sum")
        if mi_dataset:
            self.add_state("mus", [], dist_reduce_fx="cat")
            self.add_state("logvars", [], dist_reduce_fx="cat")

    def update(self, rec, kl, n_tokens, mu=None, logvar=None, features=None, iw_nll=None, mi_generator=None) -> None:
        b = rec.numel()
        self.n += b
        self.tokens += n_tokens.sum()
        self.rec += rec.sum()
        self.kl += kl.sum()
        if iw_nll is not None:
            self.iw_n += b
            self.iw += iw_nll.sum()
        if mu is None:
            return
        mu64 = mu.double()
        self.mu_sum += mu64.sum(0)
        self.mu_sq_sum += (mu64**2).sum(0)
        h64 = features.double()
        self.unit_sum += torch.nn.functional.normalize(h64, dim=-1).sum(0)
        self.feature_sum += h64.sum(0)
        self.feature_outer += h64.T @ h64
        self.mu_outer += mu64.T @ mu64
        self.mi += b * mutual_information(mu.double(), logvar.double(), mi_generator)
        if self.with_mi_dataset:
            self.mus.append(mu.detach())
            self.logvars.append(logvar.detach())

    def compute(self) -> dict[str, torch.Tensor]:
        n = self.n
        out = {
            "loss": (self.rec + self.kl) / n,  # -ELBO with KL weight 1: the model-selection value
            "rec": self.rec / n,
            "kl": self.kl / n,
            "elbo_ppl": torch.exp((self.rec + self.kl) / self.tokens),
        }
        if self.iw_n > 0:
            out["iw_nll"] = self.iw / self.iw_n
            out["iw_ppl"] = torch.exp(self.iw / self.tokens) if self.iw_n == n else torch.tensor(float("nan"))
        if self.latent_dim:
            out["mi"] = self.mi / n
            out["au"] = active_units(self.mu_sum, self.mu_sq_sum, int(n))
            out["feature_cos"] = pairwise_cosine_from_sum(self.unit_sum, int(n))
            for name, total, outer in (("feature", self.feature_sum, self.feature_outer), ("mu", self.mu_sum, self.mu_outer)):
                lam = spectrum(covariance_from_sums(total, outer, int(n)))  # one eigendecomposition
                for k in self.ev_ks:
                    out[f"{name}_ev{k}"] = _explained_variance(lam, k)
                out[f"{name}_erank"] = _effective_rank(lam)
            if self.with_mi_dataset:
                mus, logvars = _cat(self.mus), _cat(self.logvars)
                gen = torch.Generator(device=mus.device).manual_seed(self.seed)
                # 10 samples per posterior: with one, the estimate on 1,000 collapsed posteriors
                # (true MI 0) was a frozen 0.19 ± 0.13 nats; the expectation is the same.
                out["mi_dataset"] = mutual_information(mus.double(), logvars.double(), gen, samples=MI_DATASET_SAMPLES)
        return {k: v.float() for k, v in out.items()}


def _cat(x):
    return torch.cat(x) if isinstance(x, list) else x
