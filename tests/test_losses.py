"""KL terms, free bits and the cosine-dispersion regulariser (SPEC §2, §3, §5)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from seqvae.core.losses import BatchFreeBits, CosineDispersion, FreeBits, StandardKL, gaussian_kl, mean_pairwise_cosine

MU = torch.tensor([[0.0, 1.5, -0.7], [0.3, 0.0, 2.0]], dtype=torch.float64)
LOGVAR = torch.tensor([[0.0, -1.2, 0.8], [-3.0, 0.5, 0.0]], dtype=torch.float64)


def test_gaussian_kl_closed_form_values():
    kl = gaussian_kl(MU, LOGVAR)
    expected = 0.5 * (MU**2 + LOGVAR.exp() - LOGVAR - 1)
    torch.testing.assert_close(kl, expected)
    assert kl[0, 0] == 0.0  # the prior itself
    assert kl[0, 1] == pytest.approx(0.5 * (1.5**2 + math.exp(-1.2) + 1.2 - 1))


def test_gaussian_kl_equals_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(16, 5, generator=g, dtype=torch.float64) * 2
    logvar = torch.randn(16, 5, generator=g, dtype=torch.float64) * 1.5
    q = Normal(mu, (0.5 * logvar).exp())
    p = Normal(torch.zeros_like(mu), torch.ones_like(mu))
    torch.testing.assert_close(gaussian_kl(mu, logvar), kl_divergence(q, p), rtol=1e-12, atol=1e-12)


def test_gaussian_kl_equals_monte_carlo():
    g = torch.Generator().manual_seed(1)
    mu, logvar = MU.flatten(), LOGVAR.flatten()  # 6 independent 1-D posteriors
    n = 200_000
    eps = torch.randn(n, mu.numel(), generator=g, dtype=torch.float64)
    z = mu + (0.5 * logvar).exp() * eps
    q, p = Normal(mu, (0.5 * logvar).exp()), Normal(0.0, 1.0)
    samples = q.log_prob(z) - p.log_prob(z)  # (n, 6)
    estimate, se = samples.mean(0), samples.std(0) / math.sqrt(n)
    exact = gaussian_kl(mu, logvar)
    assert ((estimate - exact).abs() < 4 * se + 1e-12).all(), (estimate, exact, se)


def test_standard_kl_sums_dims():
    kl = gaussian_kl(MU, LOGVAR)
    torch.testing.assert_close(StandardKL()(kl), kl.sum(-1))


def test_free_bits_value_and_gradient():
    # Z = 4, target 2 -> λ = 0.5 per dimension; entries at, below and above λ
    kl = torch.tensor([[0.5, 0.2, 0.51, 3.0], [0.0, 0.7, 0.5, 0.49]], requires_grad=True)
    value = FreeBits(target=2.0)(kl)
    torch.testing.assert_close(value, torch.tensor([0.51 + 3.0, 0.7]))
    value.sum().backward()
    assert kl.grad.tolist() == [[0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]]


def test_free_bits_gradient_through_posterior():
    g = torch.Generator().manual_seed(2)
    mu = (torch.randn(6, 8, generator=g, dtype=torch.float64)).requires_grad_()
    logvar = (torch.randn(6, 8, generator=g, dtype=torch.float64) * 0.7).requires_grad_()
    target = 8 * 0.4  # λ = 0.4
    kl = gaussian_kl(mu, logvar)
    above = kl.detach() > 0.4
    assert above.any() and (~above).any()
    FreeBits(target)(kl).sum().backward()
    g_mu, g_lv = mu.grad.clone(), logvar.grad.clone()
    mu.grad = logvar.grad = None
    StandardKL()(gaussian_kl(mu, logvar)).sum().backward()
    assert (g_mu[~above] == 0).all() and (g_lv[~above] == 0).all()
    torch.testing.assert_close(g_mu[above], mu.grad[above])
    torch.testing.assert_close(g_lv[above], logvar.grad[above])
    assert (mu.grad[~above] != 0).any()  # the plain KL does push these


def test_batch_free_bits():
    kl = torch.tensor([[0.1, 2.0, 0.3], [0.5, 0.0, 0.2], [0.0, 1.0, 0.4]], requires_grad=True)
    # λ = 0.9 / 3 = 0.3; batch means 0.2, 1.0, 0.3 -> 0.3 + 1.0 + 0.3
    value = BatchFreeBits(target=0.9)(kl)
    torch.testing.assert_close(value, torch.full((3,), 1.6))
    value.mean().backward()
    # only dimension 1 (mean 1.0 > λ) has a gradient: d mean_b / d kl_b1 = 1/3
    expected = torch.tensor([[0.0, 1 / 3, 0.0]]).expand(3, -1)
    torch.testing.assert_close(kl.grad, expected)


def brute_force_cosine(h):
    n = h.size(0)
    total = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                total += float(torch.dot(h[i], h[j]) / (h[i].norm() * h[j].norm()))
    return total / (n * (n - 1))


@pytest.mark.parametrize("n", [2, 3, 7])
def test_mean_pairwise_cosine_brute_force(n):
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, 5, generator=g, dtype=torch.float64) + 0.3 * torch.arange(5)
    assert float(mean_pairwise_cosine(h)) == pytest.approx(brute_force_cosine(h), abs=1e-12)


def test_mean_pairwise_cosine_extremes():
    same = torch.tensor([[1.0, 2.0], [2.0, 4.0], [0.5, 1.0]])
    assert float(mean_pairwise_cosine(same)) == pytest.approx(1.0, abs=1e-6)
    opposite = torch.tensor([[1.0, 0.0], [-3.0, 0.0]])
    assert float(mean_pairwise_cosine(opposite)) == pytest.approx(-1.0, abs=1e-6)
    orthogonal = torch.eye(4)
    assert float(mean_pairwise_cosine(orthogonal)) == pytest.approx(0.0, abs=1e-7)


def test_cosine_dispersion_weight():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(5, 4, generator=g, dtype=torch.float64).requires_grad_()
    base = brute_force_cosine(h.detach())
    assert float(CosineDispersion(2.5)(h)) == pytest.approx(2.5 * base, abs=1e-12)
    assert float(CosineDispersion(0.0)(h)) == 0.0
    assert float(CosineDispersion(1.0)(h[:1])) == 0.0  # one sentence: no pairs
    CosineDispersion(3.0)(h).backward()
    g3 = h.grad.clone()
    h.grad = None
    CosineDispersion(1.0)(h).backward()
    torch.testing.assert_close(g3, 3 * h.grad)
    assert h.grad.abs().max() > 0
