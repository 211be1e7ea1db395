"""IsoBN on encoder features (issue 38): against a direct computation on constructed inputs, in
training and evaluation mode; what it does to correlated groups; its options; through the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from test_scoring import run
from test_transformer import REPO

from seqvae import IsoBN, SeqVAE
from seqvae.errors import ConfigError


def direct(batches: list[torch.Tensor], x: torch.Tensor, beta=0.5, m=0.05, eps=1e-3) -> torch.Tensor:
    """IsoBN written out from its definition, element by element, in float64."""
    d = x.size(1)
    cov = [[0.0] * d for _ in range(d)]
    std = [0.0] * d
    for b in batches:
        b = b.double()
        n = b.size(0)
        mean = [float(b[:, i].mean()) for i in range(d)]
        for i in range(d):
            s_i = (sum((float(b[k, i]) - mean[i]) ** 2 for k in range(n)) / n) ** 0.5
            std[i] += m * (s_i - std[i])
            for j in range(d):
                c = sum((float(b[k, i]) - mean[i]) * (float(b[k, j]) - mean[j]) for k in range(n)) / n
                cov[i][j] += m * (c - cov[i][j])
    gamma = [sum(max(-1.0, min(1.0, cov[i][j] / (std[i] * std[j]))) ** 2 for j in range(d)) / d for i in range(d)]
    a = [(gamma[i] * std[i] + eps) ** -beta for i in range(d)]
    total = sum(cov[i][i] for i in range(d))
    kept = (total / (sum(cov[i][i] * a[i] ** 2 for i in range(d)) + eps)) ** 0.5
    return torch.stack([x[:, i].double() * a[i] * kept for i in range(d)], 1)


def test_isobn_matches_the_direct_computation_in_training_and_evaluation():
    g = torch.Generator().manual_seed(0)
    mix = torch.tensor([[1.0, 0.9, 0.0, 0.0], [0.0, 0.3, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.5]])
    batches = [torch.randn(6, 4, generator=g) @ mix + 3.0 for _ in range(3)]
    norm = IsoBN(beta=0.5, momentum=0.2, eps=1e-3).build(4).train()
    outs = [norm(b) for b in batches]
    for k, out in enumerate(outs):  # training: each batch scaled by the statistics including itself
        torch.testing.assert_close(out.double(), direct(batches[: k + 1], batches[k], m=0.2), rtol=1e-5, atol=1e-6)
    x = torch.randn(5, 4, generator=g)
    norm.eval()
    torch.testing.assert_close(norm(x).double(), direct(batches, x, m=0.2), rtol=1e-5, atol=1e-6)
    assert int(norm.batches) == 3  # evaluation does not update the statistics
    torch.testing.assert_close(norm(x), norm(x))


def test_a_correlated_group_is_damped_and_the_total_variance_kept():
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4000, 1, generator=g)
    # dims 0-2: one direction three times (a group of 3); dim 3 alone; all of variance 1
    x = torch.cat([base, base, base, torch.randn(4000, 1, generator=g)], 1)
    norm = IsoBN(beta=0.5, momentum=1.0).build(4).train()
    y = norm(x)
    a = norm.scale()
    assert a[0] == pytest.approx(a[1]) == pytest.approx(a[2]) and a[3] > a[0]
    # γ = 3/4 in the group, 1/4 alone: a ∝ (γ s)^(−1/2), so the ratio is √3 (up to ε and sampling)
    assert float(a[3] / a[0]) == pytest.approx(3**0.5, rel=0.01)
    assert float(y.var(0, unbiased=False).sum()) == pytest.approx(float(x.var(0, unbiased=False).sum()), rel=1e-3)
    torch.testing.assert_close(IsoBN(beta=0.0).build(4).train()(x), x, rtol=5e-3, atol=0)  # β = 0: the identity, up to ε


def test_before_any_batch_it_is_the_identity_and_its_gradient_is_a_constant_scale():
    norm = IsoBN().build(3).eval()
    x = torch.randn(4, 3, requires_grad=True)
    assert torch.equal(norm(x), x)
    norm.train()(torch.randn(8, 3))
    y = norm.eval()(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, norm.scale().float().expand(4, 3))


@pytest.mark.parametrize("settings, says", [
    (dict(beta=-1.0), "model.feature_norm.init_args.beta"),
    (dict(momentum=0.0), "model.feature_norm.init_args.momentum"),
    (dict(eps=0.0), "model.feature_norm.init_args.eps"),
])  # fmt: skip
def test_bad_settings_name_the_option(settings, says):
    with pytest.raises(ConfigError) as err:
        IsoBN(**settings).build(4)
    assert says in str(err.value)


def test_either_encoder_takes_it_and_the_lm_refuses_it():
    for kw in ({}, {"encoder": __import__("seqvae").TransformerEncoder(d_model=8, heads=2)}):
        m = SeqVAE(vocab_size=30, embed_dim=8, hidden_dim=12, latent_dim=4, pooling="avg", feature_norm=IsoBN(), **kw)
        assert "feature_norm.cov" in dict(m.encoder.named_buffers())
    with pytest.raises(ConfigError, match="model.feature_norm: the language model"):
        SeqVAE(vocab_size=30, embed_dim=8, hidden_dim=12, latent_dim=0, feature_norm=IsoBN())


def test_the_overlay_through_the_cli(tmp_path, capsys):
    words = ["bad awful", "poor meh", "fine okay", "good nice", "great superb"]
    path = tmp_path / "reviews.txt"
    path.write_text("".join(f"{i % 5} the food was {words[i % 5]} w{i % 13} end\n" for i in range(1, 61)))
    args = ["fit", "--config", REPO / "configs/demo.yaml", "--config", REPO / "configs/transformer/isobn.yaml",
            f"--data.train={path}#1-40", f"--data.val={path}#41-50", f"--data.test={path}#51-60",
            "--data.label_column=first_token", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
            "--model.val_iw_samples=0", "--model.test_iw_samples=2", "--trainer.max_epochs=1",
            "--trainer.enable_model_summary=false", "--trainer.num_sanity_val_steps=0",
            f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=iso"]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    run_dir = tmp_path / "demo" / "iso"
    assert "class_path: seqvae.IsoBN" in (run_dir / "config.yaml").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["test/feature_ev1"] > 0
    reloaded = SeqVAE.load_from_checkpoint(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=True)
    assert int(reloaded.encoder.feature_norm.batches) > 0  # the moving statistics are in the checkpoint
