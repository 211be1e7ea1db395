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

from seqvae.core import dispersion

# re-exported: their home before dispersion.py and gaussian.py
from seqvae.core.dispersion import covariance_from_sums, effective_rank, explained_variance, pairwise_cosine_from_sum, spectrum  # noqa: F401
from seqvae.core.gaussian import LOG_2PI, DiagonalGaussian, log_normal, log_standard_normal, sample_posterior  # noqa: F401

MI_DATASET_SAMPLES = 10


LogLikelihood = Callable[[torch.Tensor], torch.Tensor]  # z (B, K, Z) -> log p(x | z) (B, K)


def posterior_iw_log_weights(log_likelihood: LogLikelihood, q, n_samples: int, chunk: int, generator=None) -> torch.Tensor:
    """log w_k = log p(x|z_k) + log p(z_k) - log q(z_k|x) for K samples of the batch's posteriors
    `q` (`posteriors.py`), decoded `chunk` samples at a time (the decoder batch is B·chunk
    sequences): (B, K). All K·B·Z noise values are drawn at once, so the samples (and the
    estimate) do not depend on `chunk`."""
    z_all, log_q = q.draw(n_samples, generator)  # (B, K, Z), (B, K): a flow's log q needs its pre-flow draws
    out = []
    for start in range(0, n_samples, chunk):
        z = z_all[:, start : start + chunk]
        out.append(log_likelihood(z) + log_standard_normal(z) - log_q[:, start : start + chunk])
    return torch.cat(out, dim=1)


def iw_log_weights(
    log_likelihood: LogLikelihood, mu: torch.Tensor, logvar: torch.Tensor, n_samples: int, chunk: int, generator=None
) -> torch.Tensor:
    """`posterior_iw_log_weights` of the diagonal Gaussians N(mu, diag exp(logvar))."""
    return posterior_iw_log_weights(log_likelihood, DiagonalGaussian(mu, logvar), n_samples, chunk, generator)


def iw_nll(
    log_likelihood: LogLikelihood, mu: torch.Tensor, logvar: torch.Tensor, n_samples: int, chunk: int, generator=None
) -> torch.Tensor:
    """Importance-weighted NLL estimate per sentence: -(logsumexp_k log w_k - log K), (B,).
    The encoder runs once; the K samples are batched with the sentences."""
    return iw_nll_from_weights(iw_log_weights(log_likelihood, mu, logvar, n_samples, chunk, generator))


def iw_nll_from_weights(log_w: torch.Tensor) -> torch.Tensor:
    """-(logsumexp_k log w_k - log K) per sentence from the (B, K) log-weights."""
    return -(torch.logsumexp(log_w, dim=1) - math.log(log_w.size(1)))


def iw_nll_standard_error(log_w: torch.Tensor) -> torch.Tensor:
    """Monte-Carlo standard error of the IW-NLL estimate -log((1/K) Σ_k w_k) from its own K
    weights, by the delta method: sd(w) / (√K · mean(w)), sd with divisor K-1. log_w (B, K)
    -> (B,). Computed on w / max_k w (the ratio does not change), so no weight overflows; NaN
    for K = 1 (no spread to estimate)."""
    k = log_w.size(1)
    if k == 1:  # (torch's std would warn about zero degrees of freedom and give the same NaN)
        return torch.full(log_w.shape[:1], float("nan"), dtype=log_w.dtype, device=log_w.device)
    w = (log_w - log_w.max(dim=1, keepdim=True).values).exp()
    return w.std(dim=1) / (math.sqrt(k) * w.mean(dim=1))


# Memory budget of one block of log densities in the dataset MI: (rows of z) x M elements.
MI_MAX_ELEMENTS = 2**20
# The expanded exponent Σ z²/σ² - 2 z·μ/σ² + μ²/σ² loses precision to cancellation when its
# terms are large (sharp posteriors far from the centre); an entry that counts in the logsumexp
# and whose rounding bound could exceed this (nats) is recomputed from (z - μ)².
_EXPANSION_TOL = 1e-10
_LOGSUMEXP_MARGIN = 50.0  # entries further below a row's maximum weigh < M·e^-50 in it


def log_aggregate_posterior(
    z: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor, max_elements: int = MI_MAX_ELEMENTS
) -> torch.Tensor:
    """log q(z_i) = logsumexp_j log N(z_i; mu_j, σ_j²) - log M for each row of z (N, Z), with q
    the mixture of the M posteriors (mu, logvar (M, Z)): (N,). Rows of z go max_elements // M at
    a time, so every temporary is a (rows, M) block (or ≤ max_elements elements), whatever M.
    The log densities come from matrix products (the Gaussian exponent expanded), O(N·M·Z) flops;
    the entries that count and could carry a rounding error above 1e-10 nats are recomputed
    from (z - μ)² as `log_normal` does, so the result is that of the direct formula."""
    m, nz = mu.shape
    n = z.size(0)
    centre = mu.mean(0)  # shifting z and μ together changes no difference and cuts cancellation
    mu_c, z_c = mu - centre, z - centre
    prec = (-logvar).exp()
    a = mu_c * prec
    mu_term = (mu_c * a).sum(-1)  # Σ μ²/σ², (M,)
    const = logvar.sum(-1) + nz * LOG_2PI
    # |rounding| of the expanded exponent ≤ (Z + 4)·eps·Σ|terms|/2 in nats, and |2zμ| ≤ z² + μ²
    round_scale = (nz + 4) * torch.finfo(z.dtype).eps
    rows = max(1, min(n, max_elements // m))
    step = max(1, max_elements // nz)
    # The blocks are allocated once and reused: fresh ~8 MB blocks per iteration, fenced in by
    # the small tensors each one leaves, grew glibc's heap by one block per iteration (10,000
    # texts: 7.7 GB with glibc's default thresholds).
    like = dict(dtype=z.dtype, device=z.device)
    quad_buf, logp_buf = torch.empty(rows, m, **like), torch.empty(rows, m, **like)
    counts_buf, loose_buf = (torch.empty(rows, m, dtype=torch.bool, device=z.device) for _ in range(2))
    log_qz = torch.empty(n, **like)
    for s in range(0, n, rows):
        r = min(rows, n - s)
        zb, quad, logp, counts, loose = z_c[s : s + r], quad_buf[:r], logp_buf[:r], counts_buf[:r], loose_buf[:r]
        torch.matmul(zb * zb, prec.T, out=quad)  # Σ z²/σ², (r, M)
        torch.matmul(zb, a.T, out=logp)
        logp.mul_(-2).add_(quad).add_(mu_term).add_(const).mul_(-0.5)
        bound = quad.add_(mu_term).mul_(round_scale)
        floor = logp.max(1, keepdim=True).values - _LOGSUMEXP_MARGIN
        torch.gt(bound, _EXPANSION_TOL, out=loose)
        torch.ge(bound.add_(logp), floor, out=counts)  # bound is not needed after this
        i, j = counts.logical_and_(loose).nonzero(as_tuple=True)
        for t in range(0, i.numel(), step):
            ii, jj = i[t : t + step], j[t : t + step]
            lv = logvar[jj]
            logp[ii, jj] = -0.5 * ((z[s + ii] - mu[jj]) ** 2 / lv.exp() + lv + LOG_2PI).sum(-1)
        # logsumexp over the row, in place (torch.logsumexp would allocate an (r, M) temporary)
        top = logp.max(1, keepdim=True).values
        log_qz[s : s + r] = logp.sub_(top).exp_().sum(1).log_().add_(top[:, 0])
    return log_qz - math.log(m)


def mutual_information(
    mu: torch.Tensor,
    logvar: torch.Tensor,
    generator=None,
    samples: int = 1,
    max_elements: int = MI_MAX_ELEMENTS,
    return_se: bool = False,
):
    """I(x; z) = E[-H(q(z|x))] - E[log q(z)] with the aggregate posterior q(z) the mixture of the
    M posteriors given (He et al.'s estimator; the pool is whatever rows are passed), from
    `samples` z per posterior (He et al.: 1). Bounded above by log M in expectation; one draw can
    exceed it (by up to the mean of (Σ_d ε_d² − Z)/2 over the draws, ε the standard-normal noise of
    each z: log q(z_i) ≥ log q(z_i|x_i) − log M). More samples leave the
    expectation unchanged and cut the Monte-Carlo noise of the second term by √samples.
    Memory: (rows, M) blocks of at most max_elements (`log_aggregate_posterior`).

    With return_se, returns (MI, se): se = sd / √(M·S) of the M·S values log q(z) (divisor
    M·S - 1), the Monte-Carlo standard error of the second term (the first is exact) treating
    the values as i.i.d. Given the pool they are independent but not identically distributed
    (each z comes from its own posterior), so this sd also holds the spread between texts of
    E[log q(z) | x]: in expectation it is at least the noise that another draw of z would show
    (conservative; about equal when that spread is small)."""
    return posterior_mutual_information(DiagonalGaussian(mu, logvar), generator, samples, max_elements, return_se)


def posterior_mutual_information(
    q, generator=None, samples: int = 1, max_elements: int = MI_MAX_ELEMENTS, return_se: bool = False
):
    """`mutual_information` of the M posteriors `q` of any family (`posteriors.py`): its entropy
    and its cross-densities log q(z_i|x_j) come from `q`."""
    m, nz = q.mean.shape
    neg_entropy = q.neg_entropy().mean()
    z = q.sample(samples, generator).reshape(m * samples, nz)  # (M·S, Z)
    log_qz = q.log_mixture(z, log_aggregate_posterior, max_elements)
    mi = neg_entropy - log_qz.mean()
    if return_se:
        return mi, log_qz.std() / math.sqrt(log_qz.numel())
    return mi


def mean_variance(mu_sum: torch.Tensor, mu_sq_sum: torch.Tensor, n: int) -> torch.Tensor:
    """Var_x(E_q[z_d]) per dimension (divisor N-1, as He et al.'s calc_au), from float64 sums."""
    return (mu_sq_sum - mu_sum**2 / n) / (n - 1)


def active_units(mu_sum: torch.Tensor, mu_sq_sum: torch.Tensor, n: int, threshold: float = 0.01) -> torch.Tensor:
    """Number of dimensions whose posterior mean varies over the data: Var_x(E_q[z_d]) (divisor
    N-1) ≥ threshold, from float64 sums so that the set can be fed in any chunks."""
    return (mean_variance(mu_sum, mu_sq_sum, n) >= threshold).sum()


class EvalMetrics(Metric):
    """Every evaluation metric in one pass.

    `update` takes per-sentence reconstruction (summed cross-entropy) and KL, the number of
    predicted tokens, the posterior (mu, logvar), the encoder features and, optionally,
    the per-sentence IW-NLL. MI per batch (`mi`) uses each update's rows as the pool, weighted
    by batch size; `mi_dataset` pools the whole set (stored, computed once at the end).
    The spectrum of the encoder features and of the posterior means (`feature_ev1`, `_ev3`,
    `_erank`, and `mu_…`: EV_k for each k in `ev_ks`, effective rank) comes from their sums and
    sums of outer products: deterministic, no noise drawn.

    Monte-Carlo standard errors: `iw_nll_se`, of the mean IW-NLL, sqrt(Σ se_i²) / N over the N
    texts given a finite `iw_se` (`iw_nll_standard_error`), present once any update passed
    iw_se; `mi_dataset_se` with `mi_dataset` (see `mutual_information`). With per_text=True,
    every update's texts are kept as rows (`per_text_rows`); `index` is then required.
    """

    full_state_update = False

    PER_TEXT = ("index", "neg_elbo", "kl", "iw_nll", "iw_se", "tokens")

    def __init__(
        self,
        latent_dim: int,
        feature_dim: int,
        mi_dataset: bool = True,
        seed: int = 0,
        ev_ks=(1, 3),
        per_text: bool = False,
        ais: bool = False,
        text_columns: tuple[str, ...] = (),
    ):
        super().__init__()
        self.latent_dim, self.with_mi_dataset, self.seed, self.ev_ks = latent_dim, mi_dataset, seed, tuple(ev_ks)
        # AIS: model.ais; text_columns: a KL penalty's own per-text test estimates (`update_text_columns`)
        self.text_columns = tuple(text_columns) if per_text else ()
        self.per_text_columns = self.PER_TEXT + ("ais_nll", "ais_se") * ais + self.text_columns
        self.per_text = per_text
        f64 = dict(dtype=torch.float64)
        ais_sums = ("ais_n", "ais", "ais_se_n", "ais_se_sq", "ais_accept_n", "ais_accept", "ais_seconds") if ais else ()
        for name in ("n", "tokens", "rec", "kl", "iw_n", "iw", "mi", "iw_se_given", "iw_se_n", "iw_se_sq", *ais_sums):
            self.add_state(name, torch.zeros((), **f64), dist_reduce_fx="sum")
        self.add_state("mu_sum", torch.zeros(latent_dim, **f64), dist_reduce_fx="sum")
        self.add_state("mu_sq_sum", torch.zeros(latent_dim, **f64), dist_reduce_fx="sum")
        self.add_state("kl_dim_sum", torch.zeros(latent_dim, **f64), dist_reduce_fx="sum")
        self.add_state("unit_sum", torch.zeros(feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("feature_sum", torch.zeros(feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("feature_outer", torch.zeros(feature_dim, feature_dim, **f64), dist_reduce_fx="sum")
        self.add_state("mu_outer", torch.zeros(latent_dim, latent_dim, **f64), dist_reduce_fx="sum")
        if mi_dataset:
            self.add_state("q_rows", [], dist_reduce_fx="cat")  # each text's posterior parameters
        if per_text:  # "cat" states: a DDP run gathers every rank's rows
            for name in self.per_text_columns:
                self.add_state(f"text_{name}", [], dist_reduce_fx="cat")

    def update(
        self,
        rec,
        kl,
        n_tokens,
        mu=None,
        logvar=None,
        features=None,
        iw_nll=None,
        mi_generator=None,
        index=None,
        iw_se=None,
        posterior=None,
        ais: dict | None = None,
    ) -> None:
        b = rec.numel()
        self.n += b
        self.tokens += n_tokens.sum()
        self.rec += rec.sum()
        self.kl += kl.sum()
        if iw_nll is not None:
            self.iw_n += b
            self.iw += iw_nll.sum()
        if iw_se is not None:
            se = iw_se.double()
            finite = torch.isfinite(se)  # K = 1 gives NaN: no spread to estimate from
            self.iw_se_given += b
            self.iw_se_n += finite.sum()
            self.iw_se_sq += se[finite].pow(2).sum()
        if self.per_text:
            if index is None:
                raise ValueError("EvalMetrics(per_text=True).update needs index (the texts' dataset positions)")
            nan = torch.full((b,), float("nan"), dtype=torch.float64, device=rec.device)
            self.text_index.append(index.detach().long().reshape(b))
            self.text_neg_elbo.append(rec.detach().double() + kl.detach().double())
            self.text_kl.append(kl.detach().double())
            self.text_iw_nll.append(nan if iw_nll is None else iw_nll.detach().double())
            self.text_iw_se.append(nan if iw_se is None else iw_se.detach().double())
            self.text_tokens.append(n_tokens.detach().long())
        if ais is not None:  # `AIS.estimate`: per-text nll, se, accept; the batch's seconds
            self._add_ais(ais, b)
        if posterior is None and mu is None:
            return
        q = (posterior if posterior is not None else DiagonalGaussian(mu, logvar)).base  # a flow's: before it (SPEC §12.6)
        q64 = q.double()
        mu64 = q64.mean
        self.mu_sum += mu64.sum(0)
        self.mu_sq_sum += (mu64**2).sum(0)
        self.kl_dim_sum += q64.marginal_kl().sum(0)  # KL(q(z_d|x) || N(0, 1)) per dimension
        h64 = features.double()
        self.unit_sum += torch.nn.functional.normalize(h64, dim=-1).sum(0)
        self.feature_sum += h64.sum(0)
        self.feature_outer += h64.T @ h64
        self.mu_outer += mu64.T @ mu64
        self.mi += b * posterior_mutual_information(q64, mi_generator)
        if self.with_mi_dataset:
            self.q_rows.append(q.rows().detach())
            self._q_like = q  # the family (and what its texts share) that the pool's rows are rebuilt with

    def update_text_columns(self, values: dict[str, torch.Tensor], b: int) -> None:
        """The `text_columns` of the last `update`'s b texts (NaN for a column not given), so
        per_text.csv's rows stay aligned; nothing without per-text columns."""
        for name in self.text_columns:
            v = values.get(name)
            column = getattr(self, f"text_{name}")
            nan = torch.full((b,), float("nan"), dtype=torch.float64, device=self.n.device)
            column.append(nan if v is None else v.detach().double().reshape(b))

    def _add_ais(self, ais: dict, b: int) -> None:
        se, accept = ais["se"].double(), ais["accept"].double()
        self.ais_n, self.ais = self.ais_n + b, self.ais + ais["nll"].double().sum()
        self.ais_seconds = self.ais_seconds + ais["seconds"]
        self.ais_se_n, self.ais_se_sq = self.ais_se_n + se.isfinite().sum(), self.ais_se_sq + se[se.isfinite()].pow(2).sum()
        self.ais_accept_n, self.ais_accept = self.ais_accept_n + accept.isfinite().sum(), self.ais_accept + accept.nansum()
        if self.per_text:
            self.text_ais_nll.append(ais["nll"].detach().double())
            self.text_ais_se.append(se.detach())

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
        if getattr(self, "ais_n", 0) > 0:  # as the IW-NLL's: mean, s.e. of the mean, per-token perplexity
            out.update(ais_nll=self.ais / self.ais_n, ais_nll_se=self.ais_se_sq.sqrt() / self.ais_se_n)
            out.update(ais_ppl=torch.exp(self.ais / self.tokens) if self.ais_n == n else torch.tensor(float("nan")))
            out.update(ais_accept=self.ais_accept / self.ais_accept_n, ais_seconds_per_text=self.ais_seconds / self.ais_n)
        if self.iw_se_given > 0:
            # independent texts: Var(mean) = Σ se_i² / N²
            out["iw_nll_se"] = self.iw_se_sq.sqrt() / self.iw_se_n  # 0/0 = NaN when no se was finite
        if self.latent_dim:
            out["mi"] = self.mi / n
            out["au"] = active_units(self.mu_sum, self.mu_sq_sum, int(n))
            out["feature_cos"] = dispersion.pairwise_cosine_from_sum(self.unit_sum, int(n))
            for name, total, outer in (("feature", self.feature_sum, self.feature_outer), ("mu", self.mu_sum, self.mu_outer)):
                lam = dispersion.spectrum(dispersion.covariance_from_sums(total, outer, int(n)))  # one eigendecomposition
                for k in self.ev_ks:
                    out[f"{name}_ev{k}"] = dispersion.explained_variance_of(lam, k)
                out[f"{name}_erank"] = dispersion.effective_rank_of(lam)
            if self.with_mi_dataset:
                pool = self._q_like.from_rows(_cat(self.q_rows)).double()
                gen = torch.Generator(device=pool.mean.device).manual_seed(self.seed)
                # 10 samples per posterior: with one, the estimate's s.d. on 1,000 posteriors that
                # ignore x (true MI 0, Z 32) is 0.12 nats, with ten 0.04 (scripts/studies.py mi-noise);
                # the expectation is the same.
                out["mi_dataset"], out["mi_dataset_se"] = posterior_mutual_information(
                    pool, gen, samples=MI_DATASET_SAMPLES, return_se=True
                )
        return {k: v.float() for k, v in out.items()}

    def per_dimension(self) -> dict[str, torch.Tensor]:
        """Per latent dimension, float64 on the CPU: `var_mu` = Var_x(E_q[z_d]) (divisor N-1; AU
        counts the dimensions with var_mu ≥ 0.01) and `kl` = the mean over texts of KL(q(z_d|x) ||
        N(0, 1)) (the posterior given; summed over d it is the test KL of a Gaussian-prior model).
        Call before reset()."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=self._should_unsync):
            n = int(self.n)
            var = mean_variance(self.mu_sum, self.mu_sq_sum, n) if n > 1 else torch.full_like(self.mu_sum, float("nan"))
            return {"var_mu": var.cpu(), "kl": (self.kl_dim_sum / max(n, 1)).cpu()}

    def per_text_rows(self) -> dict[str, torch.Tensor]:
        """The per-text columns (per_text=True) over all updates (and all ranks under DDP),
        sorted by index: index, neg_elbo (rec + kl, one z sample), kl, iw_nll and iw_se (NaN where
        not given), tokens (predicted tokens). Call before reset()."""
        if not self.per_text:
            raise RuntimeError("EvalMetrics was built with per_text=False: no per-text rows kept")
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=self._should_unsync):
            cols = {}
            for name in self.per_text_columns:
                col = getattr(self, f"text_{name}")  # a list, or one tensor once synced
                empty = torch.zeros(0, dtype=torch.long if name in ("index", "tokens") else torch.float64)
                cols[name] = _cat(col) if len(col) else empty
        for name in self.text_columns:  # a test that never asked the penalty (not under trainer.testing): NaN
            if len(cols[name]) != len(cols["index"]):
                cols[name] = torch.full(cols["index"].shape, float("nan"), dtype=torch.float64)
        order = torch.argsort(cols["index"], stable=True)
        return {name: col[order] for name, col in cols.items()}


def _cat(x):
    return torch.cat(x) if isinstance(x, list) else x
