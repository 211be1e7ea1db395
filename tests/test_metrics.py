"""IW-NLL, mutual information, active units, dispersion and EvalMetrics (SPEC §6)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from torch.distributions import Normal

from seqvae.data import BOS_ID, EOS_ID
from seqvae.losses import gaussian_kl
from seqvae.metrics import (
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
from seqvae.networks import LSTMDecoder

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


# ---------------------------------------------------------------- mutual information
def brute_force_mi(mu, logvar, z):
    m = mu.size(0)
    total = 0.0
    for i in range(m):
        q_i = Normal(mu[i], (0.5 * logvar[i]).exp())
        neg_h = -q_i.entropy().sum()
        densities = [Normal(mu[j], (0.5 * logvar[j]).exp()).log_prob(z[i]).sum() for j in range(m)]
        log_qz = torch.logsumexp(torch.stack(densities), 0) - math.log(m)
        total += float(neg_h - log_qz)
    return total / m


@pytest.mark.parametrize("chunk", [1, 2, 1024])
def test_mutual_information_brute_force(chunk):
    mu, logvar = posterior(6, 3, 20)
    z = sample_posterior(mu, logvar, 1, gen(21))[:, 0]
    got = mutual_information(mu, logvar, gen(21), chunk=chunk)
    assert float(got) == pytest.approx(brute_force_mi(mu, logvar, z), abs=1e-10)


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
    from seqvae.metrics import mutual_information

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
    from seqvae.metrics import effective_rank, explained_variance

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
