"""IW-NLL, mutual information, active units, dispersion and EvalMetrics (SPEC §6)."""

from __future__ import annotations

import math
import os
import statistics
import sys

import pytest
import torch
from torch.distributions import Normal

from seqvae.core.losses import gaussian_kl
from seqvae.core.metrics import (
    MI_DATASET_SAMPLES,
    EvalMetrics,
    active_units,
    iw_log_weights,
    iw_nll,
    log_normal,
    log_standard_normal,
    mutual_information,
    pairwise_cosine_from_sum,
    sample_posterior,
)
from seqvae.core.networks import LSTMDecoder
from seqvae.text.datamodule import BOS_ID, EOS_ID

F64 = torch.float64


def gen(seed):
    return torch.Generator().manual_seed(seed)


def posterior(b, z, seed, scale=1.0):
    g = gen(seed)
    return torch.randn(b, z, generator=g, dtype=F64) * scale, torch.randn(b, z, generator=g, dtype=F64) * 0.5


# ---------------------------------------------------------------- densities
def test_log_normal_equals_torch_distributions():
    mu, logvar = posterior(4, 3, 0, scale=2.0)
    z = torch.randn(4, 5, 3, generator=gen(1), dtype=F64) * 3
    expected = Normal(mu.unsqueeze(1), (0.5 * logvar).exp().unsqueeze(1)).log_prob(z).sum(-1)
    torch.testing.assert_close(log_normal(z, mu, logvar), expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(log_standard_normal(z), Normal(0.0, 1.0).log_prob(z).sum(-1), rtol=1e-12, atol=1e-12)


def test_sample_posterior_is_reparameterised_noise():
    mu, logvar = posterior(3, 2, 2)
    z = sample_posterior(mu, logvar, 4, gen(7))
    eps = torch.randn(3, 4, 2, generator=gen(7), dtype=F64)
    torch.testing.assert_close(z, mu.unsqueeze(1) + (0.5 * logvar).exp().unsqueeze(1) * eps, rtol=0, atol=0)


# ---------------------------------------------------------------- IW-NLL
V, E, H, Z = 20, 6, 10, 3


def tiny_decoder(seed=0):
    torch.manual_seed(seed)
    dec = LSTMDecoder(V, E, H, Z).double()
    for p in dec.parameters():
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return dec.eval()


def batch():
    tokens = torch.tensor([[BOS_ID, 5, 6, 7, EOS_ID], [BOS_ID, 8, EOS_ID, 0, 0], [BOS_ID, 9, 9, EOS_ID, 0]])
    return tokens, torch.tensor([5, 3, 4])


def test_iw_nll_k1_is_negative_elbo_for_the_same_noise():
    dec = tiny_decoder()
    tokens, lengths = batch()
    mu, logvar = posterior(3, Z, 3)
    ll = lambda z: dec.log_likelihood(tokens, lengths, z)  # noqa: E731
    with torch.no_grad():
        got = iw_nll(ll, mu, logvar, 1, 1, gen(11))
        # by hand: one z per sentence from the same generator state
        eps = torch.randn(3, 1, Z, generator=gen(11), dtype=F64)
        z = mu[:, None] + (0.5 * logvar).exp()[:, None] * eps
        rec = -dec.log_likelihood(tokens, lengths, z)[:, 0]
        q = Normal(mu, (0.5 * logvar).exp())
        kl_sample = (q.log_prob(z[:, 0]) - Normal(0.0, 1.0).log_prob(z[:, 0])).sum(-1)
    torch.testing.assert_close(got, rec + kl_sample, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("k", [1, 7, 50])
def test_iw_nll_exact_when_decoder_ignores_z(k):
    """A decoder that ignores z with a collapsed posterior (q = p): every weight is p(x)."""
    log_px = torch.tensor([-12.5, -3.25, -40.0], dtype=F64)
    ll = lambda z: log_px.unsqueeze(1).expand(-1, z.size(1))  # noqa: E731
    mu, logvar = torch.zeros(3, 4, dtype=F64), torch.zeros(3, 4, dtype=F64)
    torch.testing.assert_close(iw_nll(ll, mu, logvar, k, 3, gen(k)), -log_px, rtol=1e-12, atol=1e-12)


def test_iw_nll_chunking_does_not_change_the_samples():
    mu, logvar = posterior(4, Z, 5)
    target = torch.randn(4, 1, Z, generator=gen(6), dtype=F64)
    ll = lambda z: -((z - target) ** 2).sum(-1) * 3.0  # noqa: E731
    K = 10
    ref = iw_log_weights(ll, mu, logvar, K, K, gen(12))
    for chunk in (1, 3, 4, K, 2 * K):
        assert torch.equal(iw_log_weights(ll, mu, logvar, K, chunk, gen(12)), ref), chunk
    assert torch.equal(iw_nll(ll, mu, logvar, K, 3, gen(12)), iw_nll(ll, mu, logvar, K, 1, gen(12)))
    # with the real decoder batching B·chunk sequences
    dec = tiny_decoder(1)
    tokens, lengths = batch()
    mu, logvar = posterior(3, Z, 8)
    dll = lambda z: dec.log_likelihood(tokens, lengths, z)  # noqa: E731
    with torch.no_grad():
        values = [iw_nll(dll, mu, logvar, K, c, gen(13)) for c in (1, 3, K)]
    torch.testing.assert_close(values[0], values[2], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(values[1], values[2], rtol=1e-10, atol=1e-10)


class ToyGaussian:
    """p(z) = N(0, 1), p(x|z) = N(x; z, s²) so log p(x) = log N(x; 0, 1 + s²); q(z|x) is
    deliberately off the true posterior (shifted mean, twice the variance)."""

    s2 = 0.25

    def __init__(self, n=1000, seed=0):
        self.x = torch.randn(n, generator=gen(seed), dtype=F64) * math.sqrt(1 + self.s2)
        post_mean, post_var = self.x / (1 + self.s2), self.s2 / (1 + self.s2)
        self.mu = (post_mean + 0.8 * math.sqrt(post_var)).unsqueeze(1)
        self.logvar = torch.full((n, 1), math.log(2 * post_var), dtype=F64)

    def log_likelihood(self, z):
        return -0.5 * ((self.x[:, None] - z[..., 0]) ** 2 / self.s2 + math.log(2 * math.pi * self.s2))

    def exact_nll(self):
        return 0.5 * (self.x**2 / (1 + self.s2) + math.log(2 * math.pi * (1 + self.s2)))

    def negative_elbo(self):
        m, v = self.mu[:, 0], self.logvar[:, 0].exp()
        rec = 0.5 * (((self.x - m) ** 2 + v) / self.s2 + math.log(2 * math.pi * self.s2))
        return rec + gaussian_kl(self.mu, self.logvar)[:, 0]


def test_iw_nll_toy_gaussian_bounds():
    toy = ToyGaussian()
    exact, nelbo = toy.exact_nll().mean().item(), toy.negative_elbo().mean().item()
    assert nelbo - exact > 0.4  # a real gap to close
    seeds = range(20)
    means, ses = [], []
    for k in (1, 3, 10, 100):
        vals = [iw_nll(toy.log_likelihood, toy.mu, toy.logvar, k, 7, gen(s)).mean().item() for s in seeds]
        means.append(statistics.mean(vals))
        ses.append(statistics.stdev(vals) / math.sqrt(len(vals)))
    assert abs(means[0] - nelbo) < 4 * ses[0]  # K = 1 is the ELBO estimate
    for (a, sa), (b, sb) in zip(zip(means, ses), zip(means[1:], ses[1:])):
        assert b < a - 3 * (sa + sb)  # strictly decreasing in K, well beyond the noise
    assert all(m < nelbo for m in means[1:])
    assert all(m > exact for m in means)  # an upper bound on the NLL in expectation
    assert means[-1] - exact < 0.02


# ---------------------------------------------------------------- IW-NLL standard error
def test_iw_nll_standard_error_equals_numpy():
    import numpy as np

    from seqvae.core.metrics import iw_nll_standard_error

    log_w = torch.randn(4, 7, generator=gen(70), dtype=F64) * torch.tensor([[0.1], [1.0], [3.0], [6.0]], dtype=F64)
    w = np.exp(log_w.numpy())
    expected = w.std(axis=1, ddof=1) / (math.sqrt(7) * w.mean(axis=1))
    got = iw_nll_standard_error(log_w)
    assert got.shape == (4,)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    # a common factor of the weights (here e^±800: exp alone overflows or underflows) changes nothing
    for shift in (-800.0, 800.0):
        np.testing.assert_allclose(iw_nll_standard_error(log_w + shift).numpy(), expected, rtol=1e-12)
    # two weights, w and 3w: sd = √2·w, mean = 2w -> se = √2 / (√2 · 2) = 0.5
    two = torch.tensor([[-1234.5, -1234.5 + math.log(3.0)]], dtype=F64)
    assert float(iw_nll_standard_error(two)) == pytest.approx(0.5, abs=1e-12)


def test_iw_nll_standard_error_zero_for_equal_weights_nan_for_one():
    from seqvae.core.metrics import iw_nll_standard_error

    assert torch.equal(iw_nll_standard_error(torch.full((3, 50), -417.25, dtype=F64)), torch.zeros(3, dtype=F64))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # K = 1 is a valid setting: no torch warning on the console
        one = iw_nll_standard_error(torch.tensor([[-3.0], [2.0]], dtype=F64))
    assert one.shape == (2,) and one.dtype == F64 and torch.isnan(one).all()


def test_iw_nll_standard_error_predicts_the_spread_over_draws():
    """On the toy model, the delta-method s.e. from one draw of K = 100 weights matches the
    standard deviation of the IW-NLL estimate over 400 independent draws."""
    from seqvae.core.metrics import iw_nll_standard_error

    toy = ToyGaussian(n=8, seed=3)
    estimates, predicted = [], []
    for s in range(400):
        log_w = iw_log_weights(toy.log_likelihood, toy.mu, toy.logvar, 100, 100, gen(1000 + s))
        estimates.append(-(torch.logsumexp(log_w, 1) - math.log(100)))
        predicted.append(iw_nll_standard_error(log_w))
    ratio = torch.stack(predicted).mean(0) / torch.stack(estimates).std(0)
    assert ((ratio > 0.85) & (ratio < 1.15)).all(), ratio


# ---------------------------------------------------------------- mutual information
def brute_force_mi(mu, logvar, z):
    """The estimator written out with torch.distributions, one z per posterior: z (M, Z)."""
    m = mu.size(0)
    total = 0.0
    for i in range(m):
        q_i = Normal(mu[i], (0.5 * logvar[i]).exp())
        neg_h = -q_i.entropy().sum()
        densities = [Normal(mu[j], (0.5 * logvar[j]).exp()).log_prob(z[i]).sum() for j in range(m)]
        log_qz = torch.logsumexp(torch.stack(densities), 0) - math.log(m)
        total += float(neg_h - log_qz)
    return total / m


def numpy_log_qz(mu, logvar, z):
    """log q(z_i) = log (1/M) Σ_j N(z_i; mu_j, σ_j²) in numpy, all (N, M, Z) at once: z (N, Z)."""
    import numpy as np

    mu, logvar, z = mu.numpy(), logvar.numpy(), z.numpy()
    dens = -0.5 * ((z[:, None, :] - mu[None]) ** 2 / np.exp(logvar)[None] + logvar[None] + np.log(2 * np.pi)).sum(-1)
    top = dens.max(1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(dens - top).sum(1))) - np.log(mu.shape[0])


def numpy_mi(mu, logvar, z):
    """MI from the M·S samples z (M·S, Z): mean analytic -H(q) minus the mean log q(z)."""
    import numpy as np

    neg_h = (-0.5 * mu.shape[1] * np.log(2 * np.pi) - 0.5 * (1 + logvar.numpy()).sum(-1)).mean()
    return neg_h - numpy_log_qz(mu, logvar, z).mean()


BLOCKS = [1, 2, 5, 7, 64, 2**20]  # elements per (rows x M) block: 1 row, a few rows, all rows


@pytest.mark.parametrize("max_elements", BLOCKS)
def test_mutual_information_brute_force(max_elements):
    mu, logvar = posterior(6, 3, 20)
    z = sample_posterior(mu, logvar, 1, gen(21))[:, 0]
    got = mutual_information(mu, logvar, gen(21), max_elements=max_elements)
    assert float(got) == pytest.approx(brute_force_mi(mu, logvar, z), abs=1e-10)


@pytest.mark.parametrize("samples", [1, 3])
@pytest.mark.parametrize("max_elements", BLOCKS)
def test_mutual_information_blocks_equal_the_direct_formula(samples, max_elements):
    mu, logvar = posterior(40, 5, 22, scale=2.0)
    z = sample_posterior(mu, logvar, samples, gen(23)).reshape(40 * samples, 5)
    got = mutual_information(mu, logvar, gen(23), samples=samples, max_elements=max_elements)
    assert float(got) == pytest.approx(numpy_mi(mu, logvar, z), abs=1e-10)


def test_mutual_information_does_not_depend_on_the_block_size():
    mu, logvar = posterior(300, 8, 24, scale=1.5)
    values = [float(mutual_information(mu, logvar, gen(25), samples=4, max_elements=b)) for b in (300, 1000, 4096, 2**20)]
    assert max(values) - min(values) < 1e-12, values


SHARP_CASES = [
    # (scale of mu, mean logvar, offset): broad; sharp around 0; sharp and far from 0 (the
    # expanded exponent's terms ~1e8 nats); far apart and very sharp
    (1.0, -1.0, 0.0),
    (2.0, -5.0, 0.0),
    (3.0, -6.0, 40.0),
    (30.0, -12.0, -7.0),
]


@pytest.mark.parametrize("case", SHARP_CASES)
def test_log_aggregate_posterior_equals_numpy_at_any_scale(case):
    from seqvae.core.metrics import log_aggregate_posterior

    scale, lv, offset = case
    mu, logvar = posterior(60, 4, 26, scale=scale)
    mu, logvar = mu + offset, logvar + lv
    z = sample_posterior(mu, logvar, 3, gen(27)).reshape(-1, 4)
    expected = numpy_log_qz(mu, logvar, z)
    for b in (1, 100, 2**20):
        got = log_aggregate_posterior(z, mu, logvar, max_elements=b).numpy()
        assert abs(got - expected).max() < 1e-10, (case, b, abs(got - expected).max())


def test_log_aggregate_posterior_recomputes_the_entries_that_lose_precision(monkeypatch):
    """Both ways of computing a log density agree with numpy on broad posteriors; on sharp ones
    far from the centre the expanded exponent alone is off (so the recomputation is needed and is
    what makes the default exact), and recomputing every entry that counts is exact too."""
    from seqvae.core import metrics

    broad, sharp = [], []
    for case, out in ((SHARP_CASES[0], broad), (SHARP_CASES[3], sharp)):
        scale, lv, offset = case
        mu, logvar = posterior(60, 4, 26, scale=scale)
        mu, logvar = mu + offset, logvar + lv
        z = sample_posterior(mu, logvar, 3, gen(27)).reshape(-1, 4)
        expected = numpy_log_qz(mu, logvar, z)
        for tol in (0.0, math.inf):  # recompute every entry that counts / none
            monkeypatch.setattr(metrics, "_EXPANSION_TOL", tol)
            out.append(abs(metrics.log_aggregate_posterior(z, mu, logvar, max_elements=100).numpy() - expected).max())
    assert max(broad) < 1e-10 and sharp[0] < 1e-10, (broad, sharp)
    assert sharp[1] > 1e-9, sharp  # expansion alone: the rounding the recomputation removes
    # A common offset (40 here) costs the expansion nothing: z and μ are centred first.
    scale, lv, offset = SHARP_CASES[2]
    mu, logvar = posterior(60, 4, 26, scale=scale)
    mu, logvar = mu + offset, logvar + lv
    z = sample_posterior(mu, logvar, 3, gen(27)).reshape(-1, 4)
    monkeypatch.setattr(metrics, "_EXPANSION_TOL", math.inf)
    assert abs(metrics.log_aggregate_posterior(z, mu, logvar).numpy() - numpy_log_qz(mu, logvar, z)).max() < 1e-10


def test_log_aggregate_posterior_recomputes_every_entry_that_counts():
    """Sharp posteriors far apart, each with a twin half a standard deviation away: every z has
    two densities of about the same size, both with large rounding bounds; both are recomputed,
    not only the row's maximum."""
    from seqvae.core.metrics import log_aggregate_posterior

    mu, logvar = posterior(30, 4, 28, scale=30.0)
    logvar = logvar - 12.0
    mu = torch.cat([mu, mu + 0.5 * (0.5 * logvar).exp()])
    logvar = torch.cat([logvar, logvar])
    z = sample_posterior(mu, logvar, 2, gen(29)).reshape(-1, 4)
    got = log_aggregate_posterior(z, mu, logvar, max_elements=100).numpy()
    assert abs(got - numpy_log_qz(mu, logvar, z)).max() < 1e-10


MEMORY_PROBE = """
import re, sys, torch
if sys.argv[1] == "on":
    from seqvae.training.allocator import reuse_freed_memory
    assert reuse_freed_memory()
from seqvae.core.metrics import MI_DATASET_SAMPLES, mutual_information
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
m, z = 3000, 32
mu = torch.randn(m, z, generator=g, dtype=torch.float64)
logvar = torch.randn(m, z, generator=g, dtype=torch.float64) * 0.3 - 1
def kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(field + r":\\s+(\\d+)", f.read()).group(1))
# The peak since start-up includes imports (a fresh checkout's first import peaked 340 MiB above
# the resident size in CI), so the high-water mark is reset here (Linux >= 4.0).
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kib("VmRSS")
mutual_information(mu, logvar, g, samples=MI_DATASET_SAMPLES)
print((kib("VmHWM") - before) * 1024)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("allocator", ["glibc default", "on"])
def test_mutual_information_memory_does_not_grow_with_the_pool(allocator):
    """3,000 posteriors x 10 samples, 32 dimensions, as EvalMetrics computes mi_dataset: one
    (M, 1024, Z) float64 temporary would be 786 MB; the (rows, M) blocks are 8 MB each and are
    reused. (Fresh blocks per iteration grew the heap by 239 MiB here with glibc's default
    thresholds, 95 MiB with reuse_freed_memory; the reused ones by 43.)"""
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", MEMORY_PROBE, allocator]
    grew = int(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout)
    # 41-46 MiB measured; one unbounded block (max_elements=2**40) peaks 1,589 MiB. 300 MiB leaves
    # room for a loaded machine's allocator and still fails the old (M, 1024, Z) temporary.
    assert grew < 300 * 2**20, grew / 2**20


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mutual_information_zero_when_q_ignores_x(seed):
    m = 4000
    mu = torch.tensor([[0.7, -1.2]], dtype=F64).expand(m, -1)
    logvar = torch.tensor([[-0.5, 0.3]], dtype=F64).expand(m, -1)
    assert abs(float(mutual_information(mu, logvar, gen(seed)))) < 0.05


def test_mutual_information_log_m_when_posteriors_are_separate():
    m = 50
    mu = torch.zeros(m, 2, dtype=F64)
    mu[:, 0] = torch.arange(m, dtype=F64) * 10
    logvar = torch.full((m, 2), -8.0, dtype=F64)
    mi = float(mutual_information(mu, logvar, gen(3)))
    # Every z_i has density only under its own posterior: MI = log M + the one-sample noise of
    # -H(q_i) - log q_i(z_i), computed here from the same noise.
    z = sample_posterior(mu, logvar, 1, gen(3))[:, 0]
    q = Normal(mu, (0.5 * logvar).exp())
    noise = float((-q.entropy().sum(-1) - q.log_prob(z).sum(-1)).mean())
    assert mi == pytest.approx(math.log(m) + noise, abs=1e-9)
    # Large pool, 1-D: the noise (s.d. sqrt(1/2M)) is small.
    m = 3000
    mu = (torch.arange(m, dtype=F64) * 10).unsqueeze(1)
    logvar = torch.full((m, 1), -8.0, dtype=F64)
    for seed in range(3):
        assert abs(float(mutual_information(mu, logvar, gen(seed))) - math.log(m)) < 0.06


# ---------------------------------------------------------------- active units, dispersion
def constructed_means(n=50):
    """Posterior means with exact sample variances (divisor N-1) per dimension."""
    v = torch.randn(n, generator=gen(30), dtype=F64)
    v = (v - v.mean()) / v.std()  # sample variance exactly 1 (up to rounding)
    variances = torch.tensor([1.0, 0.0101, 0.0099, 0.5, 0.0, 0.001], dtype=F64)
    offsets = torch.tensor([10.0, -3.0, 0.0, 100.0, 5.0, 1.0], dtype=F64)
    return offsets + variances.sqrt() * v.unsqueeze(1)


def test_active_units_on_constructed_means():
    mu = constructed_means()
    n = mu.size(0)
    assert int(active_units(mu.sum(0), (mu**2).sum(0), n)) == 3  # dims 0, 1, 3
    # the divisor is N-1: with N, dim 1 (0.0101·49/50 < 0.01) would drop out
    assert int(active_units(mu.sum(0), (mu**2).sum(0), n, threshold=0.0100999)) == 3
    assert int(active_units(mu.sum(0), (mu**2).sum(0), n, threshold=0.0098)) == 4


def test_active_units_in_chunks_via_eval_metrics():
    mu = constructed_means()
    n = mu.size(0)
    m = EvalMetrics(latent_dim=6, feature_dim=2, mi_dataset=False)
    for s, e in ((0, 7), (7, 30), (30, n)):
        b = e - s
        m.update(torch.ones(b), torch.ones(b), torch.full((b,), 3), mu[s:e].float(), torch.zeros(b, 6), torch.randn(b, 2))
    assert int(m.compute()["au"]) == 3


def brute_force_cosine(h):
    n = h.size(0)
    return sum(float(torch.dot(h[i], h[j]) / (h[i].norm() * h[j].norm())) for i in range(n) for j in range(n) if i != j) / (
        n * (n - 1)
    )


def test_pairwise_cosine_from_sum_brute_force():
    h = torch.randn(9, 4, generator=gen(40), dtype=F64) + torch.tensor([1.0, 0.0, -0.5, 0.2], dtype=F64)
    unit_sum = torch.nn.functional.normalize(h, dim=-1).sum(0)
    assert float(pairwise_cosine_from_sum(unit_sum, 9)) == pytest.approx(brute_force_cosine(h), abs=1e-12)


# ---------------------------------------------------------------- EvalMetrics
def eval_set(n=30, z=4, f=5):
    g = gen(50)
    return {
        "rec": torch.rand(n, generator=g) * 50 + 10,
        "kl": torch.rand(n, generator=g) * 3,
        "n_tokens": torch.randint(2, 20, (n,), generator=g),
        "mu": torch.randn(n, z, generator=g) * torch.tensor([1.0, 0.5, 0.05, 0.001]),
        "logvar": torch.randn(n, z, generator=g) * 0.3 - 1,
        "features": torch.randn(n, f, generator=g) + 0.5,
        "iw_nll": torch.rand(n, generator=g) * 50 + 9,
    }


def run_metrics(data, cuts, seed=60):
    m = EvalMetrics(latent_dim=4, feature_dim=5, mi_dataset=True, seed=7)
    g = gen(seed)
    for s, e in zip(cuts, cuts[1:]):
        m.update(**{k: v[s:e] for k, v in data.items()}, mi_generator=g)
    return m.compute()


def test_eval_metrics_chunks_agree_with_one_pass():
    data = eval_set()
    n = 30
    whole = run_metrics(data, [0, n])
    parts = run_metrics(data, [0, 4, 15, 16, n])
    for key in ("loss", "rec", "kl", "elbo_ppl", "iw_nll", "iw_ppl", "au", "feature_cos", "mi_dataset"):
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-6, atol=1e-6, msg=key)
    # the values themselves, by hand
    rec, kl, tok = data["rec"].double(), data["kl"].double(), data["n_tokens"].double()
    assert float(whole["loss"]) == pytest.approx(float((rec + kl).mean()), rel=1e-6)
    assert float(whole["rec"]) == pytest.approx(float(rec.mean()), rel=1e-6)
    assert float(whole["kl"]) == pytest.approx(float(kl.mean()), rel=1e-6)
    assert float(whole["elbo_ppl"]) == pytest.approx(math.exp(float((rec + kl).sum() / tok.sum())), rel=1e-5)
    assert float(whole["iw_nll"]) == pytest.approx(float(data["iw_nll"].double().mean()), rel=1e-6)
    assert float(whole["iw_ppl"]) == pytest.approx(math.exp(float(data["iw_nll"].double().sum() / tok.sum())), rel=1e-5)
    mu = data["mu"].double()
    assert int(whole["au"]) == int((mu.var(0) >= 0.01).sum()) == 2
    assert float(whole["feature_cos"]) == pytest.approx(brute_force_cosine(data["features"].double()), abs=1e-6)
    expected_mi_dataset = mutual_information(mu, data["logvar"].double(), gen(7), samples=MI_DATASET_SAMPLES)
    assert float(whole["mi_dataset"]) == pytest.approx(float(expected_mi_dataset), abs=1e-6)
    # per-batch MI: one batch = the whole pool with the same RNG
    assert float(whole["mi"]) == pytest.approx(float(mutual_information(mu, data["logvar"].double(), gen(60))), abs=1e-6)


def test_eval_metrics_per_batch_mi_is_weighted_mean():
    data = eval_set()
    cuts = [0, 4, 15, 16, 30]
    parts = run_metrics(data, cuts)
    g = gen(60)
    weighted = 0.0
    for s, e in zip(cuts, cuts[1:]):
        weighted += (e - s) * float(mutual_information(data["mu"][s:e].double(), data["logvar"][s:e].double(), g))
    assert float(parts["mi"]) == pytest.approx(weighted / 30, abs=1e-6)
    assert float(parts["mi"]) != pytest.approx(float(run_metrics(data, [0, 30])["mi"]), abs=1e-3)


def test_eval_metrics_iw_ppl_nan_when_partial_and_reset():
    data = eval_set()
    m = EvalMetrics(latent_dim=4, feature_dim=5, mi_dataset=False)
    m.update(**{k: v[:10] for k, v in data.items()})
    m.update(**{k: v[10:] for k, v in data.items() if k != "iw_nll"})
    out = m.compute()
    assert math.isnan(float(out["iw_ppl"]))
    assert float(out["iw_nll"]) == pytest.approx(float(data["iw_nll"][:10].double().mean()), rel=1e-6)
    assert "mi_dataset" not in out
    m.reset()
    m.update(**{k: v[:5] for k, v in data.items()})
    assert float(m.compute()["rec"]) == pytest.approx(float(data["rec"][:5].double().mean()), rel=1e-6)


def test_eval_metrics_language_model():
    m = EvalMetrics(latent_dim=0, feature_dim=5)
    nll = torch.tensor([10.0, 20.0])
    m.update(nll, torch.zeros(2), torch.tensor([4, 6]), iw_nll=nll)
    out = m.compute()
    assert set(out) == {"loss", "rec", "kl", "elbo_ppl", "iw_nll", "iw_ppl"}
    assert float(out["iw_ppl"]) == pytest.approx(math.exp(3.0), rel=1e-6)
    assert float(out["loss"]) == float(out["iw_nll"]) == 15.0


def test_mutual_information_more_samples_same_mean_less_noise():
    from seqvae.core.metrics import mutual_information

    g = torch.Generator().manual_seed(0)
    mu = torch.zeros(300, 8, dtype=torch.float64)  # q(z|x) ignores x: true MI is 0
    logvar = torch.full((300, 8), -0.3, dtype=torch.float64)
    one = torch.stack([mutual_information(mu, logvar, g, samples=1) for _ in range(40)])
    ten = torch.stack([mutual_information(mu, logvar, g, samples=10) for _ in range(40)])
    assert abs(one.mean()) < 4 * one.std() / 40**0.5 and abs(ten.mean()) < 4 * ten.std() / 40**0.5
    assert ten.std() < 0.5 * one.std()  # ~ 1/sqrt(10) = 0.32 of the noise
    # sharp, far-apart posteriors: still the log M cap
    far = torch.arange(50, dtype=torch.float64).unsqueeze(1).repeat(1, 4) * 10
    # (the analytic entropy against its 500-sample estimate: ~0.06 nats of noise)
    assert mutual_information(far, torch.full_like(far, -6.0), g, samples=10) == pytest.approx(math.log(50), abs=0.25)


# ---------------------------------------------------------------- spectrum: EV_k and effective rank
def test_explained_variance_and_effective_rank_analytic():
    from seqvae.core.metrics import effective_rank, explained_variance

    cov = torch.diag(torch.tensor([4.0, 1.0, 0.0, 0.0, 0.0], dtype=F64))
    assert float(explained_variance(cov, 1)) == pytest.approx(0.8, abs=1e-12)
    assert float(explained_variance(cov, 3)) == pytest.approx(1.0, abs=1e-12)
    assert float(effective_rank(cov)) == pytest.approx(math.exp(-(0.8 * math.log(0.8) + 0.2 * math.log(0.2))), abs=1e-12)
    for d in (1, 3, 8):
        iso = 2.5 * torch.eye(d, dtype=F64)
        assert float(effective_rank(iso)) == pytest.approx(d, abs=1e-9)
        assert float(explained_variance(iso, 1)) == pytest.approx(1 / d, abs=1e-12)
        assert float(explained_variance(iso, 3)) == pytest.approx(min(3, d) / d, abs=1e-12)
    v = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=F64)
    rank1 = torch.outer(v, v)
    assert float(effective_rank(rank1)) == pytest.approx(1.0, abs=1e-9)
    assert float(explained_variance(rank1, 1)) == pytest.approx(1.0, abs=1e-12)
    # both depend on the eigenvalues only: a rotated covariance gives the same values
    q, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen(3), dtype=F64))
    rotated = q @ cov @ q.T
    assert float(explained_variance(rotated, 1)) == pytest.approx(0.8, abs=1e-9)
    assert float(effective_rank(rotated)) == pytest.approx(float(effective_rank(cov)), abs=1e-9)
    # no variance (one point, or all points equal): NaN, not a crash
    assert math.isnan(float(effective_rank(torch.zeros(3, 3, dtype=F64))))
    assert math.isnan(float(explained_variance(torch.full((3, 3), float("nan"), dtype=F64), 1)))


def test_spectrum_from_sums_in_eval_metrics_equals_numpy():
    import numpy as np

    data = eval_set()
    whole = run_metrics(data, [0, 30])
    parts = run_metrics(data, [0, 4, 15, 16, 30])
    for name, x in (("feature", data["features"]), ("mu", data["mu"])):
        lam = np.sort(np.linalg.eigvalsh(np.cov(x.double().numpy(), rowvar=False)))[::-1].clip(0)
        p = lam / lam.sum()
        for k in (1, 3):
            assert float(parts[f"{name}_ev{k}"]) == pytest.approx(lam[:k].sum() / lam.sum(), abs=1e-6)
        assert float(parts[f"{name}_erank"]) == pytest.approx(float(np.exp(-(p[p > 0] * np.log(p[p > 0])).sum())), abs=1e-5)
        for key in (f"{name}_ev1", f"{name}_ev3", f"{name}_erank"):
            torch.testing.assert_close(parts[key], whole[key], rtol=1e-6, atol=1e-6, msg=key)
    # mu has scales 1, 0.5, 0.05, 0.001: about two effective dimensions
    assert 1.5 < float(whole["mu_erank"]) < 2.5


def test_spectrum_metrics_draw_no_random_numbers():
    data = eval_set()
    m = EvalMetrics(latent_dim=4, feature_dim=5, mi_dataset=False, ev_ks=(2,))
    state = torch.get_rng_state()
    g = gen(60)
    m.update(**data, mi_generator=g)
    out = m.compute()
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(g.get_state(), gen(60).get_state()) is False  # MI drew from its own generator …
    g2 = gen(60)
    mutual_information(data["mu"].double(), data["logvar"].double(), g2)
    assert torch.equal(g.get_state(), g2.get_state())  # … exactly as much as MI alone draws
    assert {"feature_ev2", "feature_erank", "mu_ev2", "mu_erank"} <= set(out) and "feature_ev1" not in out


# ---------------------------------------------------------------- per-text rows and standard errors
NAN = float("nan")


def per_text_batches():
    """Three updates, texts out of dataset order: IW-NLL and se; neither; IW-NLL without se.
    Values are exact in float32."""
    return [
        dict(index=torch.tensor([5, 1, 3]), rec=torch.tensor([10.0, 20.0, 30.0]), kl=torch.tensor([1.0, 2.0, 0.5]),
             n_tokens=torch.tensor([4, 5, 6]), iw_nll=torch.tensor([10.5, 21.0, 29.75]),
             iw_se=torch.tensor([0.25, 0.5, NAN])),
        dict(index=torch.tensor([0, 4]), rec=torch.tensor([7.0, 8.0]), kl=torch.tensor([0.25, 0.75]),
             n_tokens=torch.tensor([2, 3])),
        dict(index=torch.tensor([2]), rec=torch.tensor([40.0]), kl=torch.tensor([0.125]), n_tokens=torch.tensor([9]),
             iw_nll=torch.tensor([39.5])),
    ]  # fmt: skip


def feed(m, batches, with_posterior=True):
    g = gen(80)
    for b in batches:
        n = b["rec"].numel()
        extra = {}
        if with_posterior:
            extra = dict(mu=torch.randn(n, 2, generator=g), logvar=torch.randn(n, 2, generator=g) * 0.1,
                         features=torch.randn(n, 3, generator=g), mi_generator=g)  # fmt: skip
        m.update(**b, **extra)


EXPECTED_ROWS = {
    "index": [0, 1, 2, 3, 4, 5],
    "neg_elbo": [7.25, 22.0, 40.125, 30.5, 8.75, 11.0],
    "kl": [0.25, 2.0, 0.125, 0.5, 0.75, 1.0],
    "iw_nll": [NAN, 21.0, 39.5, 29.75, NAN, 10.5],
    "iw_se": [NAN, 0.5, NAN, NAN, NAN, 0.25],
    "tokens": [2, 5, 9, 6, 3, 4],
}


def assert_rows(rows):
    assert list(rows) == list(EXPECTED_ROWS)
    for key, values in EXPECTED_ROWS.items():
        dtype = torch.long if key in ("index", "tokens") else F64
        assert rows[key].dtype == dtype, key
        torch.testing.assert_close(rows[key], torch.tensor(values, dtype=dtype), rtol=0, atol=0, equal_nan=True, msg=key)


@pytest.mark.parametrize("with_posterior", [True, False])
def test_per_text_rows_sorted_by_index_with_nan_where_not_given(with_posterior):
    m = EvalMetrics(latent_dim=2, feature_dim=3, mi_dataset=with_posterior, per_text=True)
    feed(m, per_text_batches(), with_posterior)
    assert_rows(m.per_text_rows())
    # se of the mean IW-NLL over the texts with a finite se: sqrt(0.25² + 0.5²) / 2
    out = m.compute()
    assert float(out["iw_nll_se"]) == pytest.approx(math.sqrt(0.25**2 + 0.5**2) / 2, abs=1e-7)
    assert_rows(m.per_text_rows())  # compute() neither consumed nor duplicated the rows


def test_per_text_states_cleared_by_reset_and_required_index():
    m = EvalMetrics(latent_dim=2, feature_dim=3, mi_dataset=True, per_text=True)
    feed(m, per_text_batches())
    m.reset()
    rows = m.per_text_rows()
    assert all(v.numel() == 0 for v in rows.values()) and rows["index"].dtype == torch.long
    b = per_text_batches()[1]
    feed(m, [b])
    rows = m.per_text_rows()
    assert rows["index"].tolist() == [0, 4] and rows["tokens"].tolist() == [2, 3]
    assert "iw_nll_se" not in m.compute()  # the se's sums were reset too
    with pytest.raises(ValueError, match="index"):
        m.update(torch.ones(2), torch.ones(2), torch.ones(2))
    with pytest.raises(RuntimeError, match="per_text"):
        EvalMetrics(latent_dim=2, feature_dim=3).per_text_rows()


def test_per_text_and_se_leave_the_other_metrics_unchanged():
    """Same updates with and without the new arguments: every existing key has the same value,
    and the only new keys are the two standard errors."""
    data = eval_set()
    n = 30
    se = torch.rand(n, generator=gen(81))
    plain = EvalMetrics(latent_dim=4, feature_dim=5, mi_dataset=True, seed=7)
    rich = EvalMetrics(latent_dim=4, feature_dim=5, mi_dataset=True, seed=7, per_text=True)
    for m, extra in ((plain, lambda s, e: {}), (rich, lambda s, e: {"index": torch.arange(s, e), "iw_se": se[s:e]})):
        g = gen(60)
        for s, e in ((0, 11), (11, n)):
            m.update(**{k: v[s:e] for k, v in data.items()}, mi_generator=g, **extra(s, e))
    a, b = plain.compute(), rich.compute()
    assert set(b) - set(a) == {"iw_nll_se"} and "mi_dataset_se" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert float(b["iw_nll_se"]) == pytest.approx(float(se.double().pow(2).sum().sqrt()) / n, rel=1e-6)
    # the per-text neg_elbo and IW-NLL average to compute()'s loss and iw_nll
    rows = rich.per_text_rows()
    assert float(rows["neg_elbo"].mean()) == pytest.approx(float(b["loss"]), rel=1e-6)
    assert float(rows["iw_nll"].mean()) == pytest.approx(float(b["iw_nll"]), rel=1e-6)
    assert torch.equal(rows["iw_se"], se.double())


def test_iw_nll_se_nan_when_no_se_is_finite():
    m = EvalMetrics(latent_dim=0, feature_dim=1)
    m.update(torch.ones(2), torch.zeros(2), torch.ones(2), iw_nll=torch.ones(2), iw_se=torch.full((2,), NAN))
    assert math.isnan(float(m.compute()["iw_nll_se"]))


def test_mi_dataset_se_equals_numpy():
    import numpy as np

    data = eval_set()
    out = run_metrics(data, [0, 4, 15, 30])  # seeded 7
    mu, logvar = data["mu"].double(), data["logvar"].double()
    z = sample_posterior(mu, logvar, MI_DATASET_SAMPLES, gen(7)).reshape(-1, 4)
    log_qz = numpy_log_qz(mu, logvar, z)
    assert log_qz.size == 30 * MI_DATASET_SAMPLES
    assert float(out["mi_dataset_se"]) == pytest.approx(float(np.std(log_qz, ddof=1) / math.sqrt(log_qz.size)), rel=1e-6)
    assert float(out["mi_dataset"]) == pytest.approx(float(numpy_mi(mu, logvar, z)), abs=1e-6)
    mi, se = mutual_information(mu, logvar, gen(7), samples=MI_DATASET_SAMPLES, return_se=True)
    assert float(mi) == pytest.approx(float(out["mi_dataset"]), abs=1e-6)
    assert float(se) == pytest.approx(float(out["mi_dataset_se"]), rel=1e-6)


def test_mi_dataset_se_bounds_the_spread_over_draws():
    """The documented approximation is conservative: the estimate's spread over 40 noise draws
    is not above the s.e. (with slack for the noise of a 40-draw sd)."""
    data = eval_set()
    mu, logvar = data["mu"].double(), data["logvar"].double()
    draws = [mutual_information(mu, logvar, gen(s), samples=MI_DATASET_SAMPLES, return_se=True) for s in range(40)]
    spread = float(torch.stack([d[0] for d in draws]).std())
    se = float(torch.stack([d[1] for d in draws]).mean())
    assert 0 < spread < 1.3 * se, (spread, se)


DDP_PROBE = """
import json, sys, torch, torch.distributed as dist
from seqvae.core.metrics import EvalMetrics
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
sys.path.insert(0, sys.argv[3])
from test_metrics import feed, per_text_batches
batches = per_text_batches()
m = EvalMetrics(latent_dim=2, feature_dim=3, mi_dataset=True, per_text=True)
feed(m, batches[:1] if rank == 0 else batches[1:])
rows = {k: v.tolist() for k, v in m.per_text_rows().items()}
out = {k: float(v) for k, v in m.compute().items()}
print(json.dumps({"rows": rows, "out": out}))
dist.destroy_process_group()
"""


def test_per_text_rows_and_se_gathered_over_ddp_ranks(tmp_path):
    """Two gloo processes, each with part of the texts: every rank gets all rows, in index order,
    and the se of the mean IW-NLL over all of them."""
    import json
    import subprocess

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    here = os.path.dirname(os.path.abspath(__file__))
    cmd = [sys.executable, "-c", DDP_PROBE]
    procs = [subprocess.Popen([*cmd, str(r), str(tmp_path / "init"), here], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in range(2)]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        rows = {k: torch.tensor(v) for k, v in r["rows"].items()}
        assert_rows({k: v if k in ("index", "tokens") else v.double() for k, v in rows.items()})
        assert r["out"]["iw_nll_se"] == pytest.approx(math.sqrt(0.25**2 + 0.5**2) / 2, abs=1e-7)
        assert r["out"]["loss"] == pytest.approx(sum(EXPECTED_ROWS["neg_elbo"]) / 6, rel=1e-6)


def test_per_dimension_variance_and_kl_match_direct_formulas_over_chunks():
    """Var_x(E[z_d]) and mean KL_d from the float64 sums, fed in uneven chunks, equal the direct
    formulas on all rows; AU is the count of var_mu ≥ 0.01; Σ_d KL_d is the KL of Gaussian rows."""
    from seqvae.core.metrics import EvalMetrics

    n, z = 37, 5
    mu, logvar = posterior(n, z, 41)
    mu[:, 3] = 0.7 + 0.01 * mu[:, 3]  # a nearly constant dimension: variance 1e-4, inactive
    m = EvalMetrics(z, 3, mi_dataset=False)
    for s, e in ((0, 10), (10, 11), (11, 37)):
        b = e - s
        kl = gaussian_kl(mu[s:e], logvar[s:e]).sum(-1)
        m.update(torch.zeros(b, dtype=F64), kl, torch.ones(b), mu[s:e], logvar[s:e], torch.randn(b, 3, dtype=F64))
    dims = m.per_dimension()
    assert torch.allclose(dims["var_mu"], mu.var(0), rtol=1e-10, atol=1e-14)
    direct = (0.5 * (mu**2 + logvar.exp() - 1 - logvar)).mean(0)
    assert torch.allclose(dims["kl"], direct, rtol=1e-12)
    assert float(dims["kl"].sum()) == pytest.approx(float(m.compute()["kl"]), rel=1e-6)
    assert int(m.compute()["au"]) == int((dims["var_mu"] >= 0.01).sum()) == 4
