"""scripts/rnf_bn_heads.py: the WAE-RNF heads' BatchNorm under its running statistics (evaluation)
against each batch's own (training), the diagnostic behind issue 48's yelp10k validation-KL spikes."""

from __future__ import annotations

import torch

from seqvae import PlanarFlowPosterior
from tests.script_loader import load_script

rnf_bn_heads = load_script("rnf_bn_heads")


def layer_with_running_statistics(mean: float, var: float):
    torch.manual_seed(0)
    layer = PlanarFlowPosterior(flows=1, batch_norm=True).layer(6, 3)
    for norm in (layer.mu_norm, layer.logvar_norm):
        norm.running_mean.fill_(mean)
        norm.running_var.fill_(var)
    return layer.eval()


def test_running_statistics_are_the_models_evaluation_path_and_normalise_by_them_exactly():
    layer = layer_with_running_statistics(0.25, 4.0)
    h = torch.randn(5, 6)
    q = rnf_bn_heads.heads(layer, h, own_batch_statistics=False)
    assert torch.equal(q.mu, layer.base(h).mu) and torch.equal(q.logvar, layer.base(h).logvar)
    pre_mu = h @ layer.weight[:3].T + layer.bias[:3]
    expected = (pre_mu - 0.25) / (4.0 + layer.mu_norm.eps) ** 0.5 * layer.mu_norm.weight + layer.mu_norm.bias
    torch.testing.assert_close(q.mu, expected)


def test_own_batch_statistics_centre_and_scale_each_dimension_over_the_batch():
    layer = layer_with_running_statistics(0.25, 4.0)
    h = torch.randn(7, 6)
    q = rnf_bn_heads.heads(layer, h, own_batch_statistics=True)
    for x, norm in ((q.mu, layer.mu_norm), (q.logvar, layer.logvar_norm)):
        z = (x - norm.bias) / norm.weight  # back to the normalised values: mean 0, biased variance ~1 per dimension
        torch.testing.assert_close(z.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(z.var(0, unbiased=False), torch.ones(3), atol=1e-3, rtol=0)
    assert torch.equal(layer.mu_norm.running_var, torch.full((3,), 4.0))  # left as they were
    one = rnf_bn_heads.heads(layer, h[:1], own_batch_statistics=True)  # a one-text batch: running statistics
    assert torch.equal(one.mu, layer.base(h[:1]).mu)


def test_a_tiny_running_variance_blows_up_the_evaluation_kl_but_not_trainings():
    # the yelp10k mechanism: equal-length training batches of collapsed features leave a running
    # variance far below the spread over the split; at evaluation exp(log σ²) and mu² explode
    layer = layer_with_running_statistics(0.0, 1e-8)
    with torch.no_grad():
        for norm in (layer.mu_norm, layer.logvar_norm):
            norm.weight.fill_(0.1)
    h = torch.randn(16, 6)
    running = rnf_bn_heads.heads(layer, h, own_batch_statistics=False).kl().mean()
    own = rnf_bn_heads.heads(layer, h, own_batch_statistics=True).kl().mean()
    assert own < 1.0 and running > 1e3, (float(own), float(running))


def test_within_length_variance_pools_each_lengths_variance_with_weights_n_minus_1():
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [10.0, 5.0], [20.0, 5.0], [30.0, 8.0], [7.0, 7.0]], dtype=torch.float64)
    lengths = torch.tensor([4, 4, 9, 9, 9, 2])  # the one text of length 2 has no variance of its own: left out
    # length 4: var (2, 0), n - 1 = 1; length 9: var (100, 3), n - 1 = 2 -> pooled (2 + 200, 0 + 6) / 3
    expected = torch.tensor([202 / 3, 2.0], dtype=torch.float64)
    torch.testing.assert_close(rnf_bn_heads.within_length_variance(x, lengths), expected)
