"""`model.posterior` (issue 47, items 1-3): the full-covariance posterior (iVAE's, SPEC §11.1)
against torch.distributions.MultivariateNormal (log q, KL, IW-NLL, MI's cross-densities), equal to
the diagonal one when its noise block is diagonal; its layer is z = W·[h; ε] + b; free bits refused
with it; fit/test/compare end to end with only its config; and every strategy class in the package
loads from a weights-only checkpoint in a process that imported nothing but the loader."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from test_configs import CONFIGS
from test_scoring import TINY, run
from torch.distributions import MultivariateNormal, kl_divergence

from seqvae.core.gaussian import DiagonalGaussian
from seqvae.core.losses import BatchFreeBits, FreeBits, StandardKL
from seqvae.core.metrics import (
    log_aggregate_posterior,
    log_standard_normal,
    posterior_iw_log_weights,
    posterior_mutual_information,
)
from seqvae.core.model import SeqVAE
from seqvae.core.posteriors import FullCovGaussian, FullCovGaussianPosterior, GaussianPosterior
from seqvae.errors import ConfigError
from seqvae.store.strategies import STRATEGIES

F64 = torch.float64
B, Z = 5, 4


def gen(seed):
    return torch.Generator().manual_seed(seed)


def random_fullcov(seed=0) -> FullCovGaussian:
    g = gen(seed)
    mu = torch.randn(B, Z, generator=g, dtype=F64)
    L = torch.randn(Z, Z, generator=g, dtype=F64) + 2 * torch.eye(Z, dtype=F64)  # not triangular, well conditioned
    return FullCovGaussian(mu, L)


def mvn(q: FullCovGaussian, i: int) -> MultivariateNormal:
    return MultivariateNormal(q.mu[i], covariance_matrix=q.L @ q.L.T)


def test_fullcov_log_q_and_kl_equal_multivariate_normal():
    q = random_fullcov()
    z = q.sample(7, gen(1))  # (B, 7, Z)
    expected = torch.stack([mvn(q, i).log_prob(z[i]) for i in range(B)])
    torch.testing.assert_close(q.log_prob(z), expected, rtol=1e-10, atol=1e-10)
    prior = MultivariateNormal(torch.zeros(Z, dtype=F64), torch.eye(Z, dtype=F64))
    kl = torch.stack([kl_divergence(mvn(q, i), prior) for i in range(B)])
    torch.testing.assert_close(q.kl(), kl, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(q.kl_terms().sum(-1), kl, rtol=1e-10, atol=1e-10)
    # each dimension's marginal N(mu_d, Σ_dd) against N(0, 1) (the per-dimension figure's KL)
    var = torch.diagonal(q.L @ q.L.T)
    marginal = torch.stack([kl_divergence(torch.distributions.Normal(q.mu[i], var.sqrt()), torch.distributions.Normal(0.0, 1.0))
                            for i in range(B)])  # fmt: skip
    torch.testing.assert_close(q.marginal_kl(), marginal, rtol=1e-10, atol=1e-10)
    # entropy, for MI: H = (d/2)(1 + log 2π) + log|det L|, the same for every text
    torch.testing.assert_close(-q.neg_entropy(), torch.stack([mvn(q, i).entropy() for i in range(B)]), rtol=1e-10, atol=1e-10)


def test_fullcov_samples_have_its_mean_and_covariance():
    q = random_fullcov(2)
    z = q.sample(200_000, gen(3))[0]  # one text
    torch.testing.assert_close(z.mean(0), q.mu[0], atol=0.02, rtol=0)
    cov = torch.cov(z.T)
    assert (cov - q.L @ q.L.T).norm() / (q.L @ q.L.T).norm() < 0.02


def test_fullcov_iw_weights_equal_multivariate_normal():
    q = random_fullcov(4)
    w = torch.randn(Z, dtype=F64, generator=gen(5))

    def ll(z):  # a toy log p(x|z), (B, K)
        return -(z - w).pow(2).sum(-1)

    log_w = posterior_iw_log_weights(ll, q, 6, 4, gen(6))
    z = q.sample(6, gen(6))  # the same draws
    expected = torch.stack([ll(z)[i] + log_standard_normal(z[i]) - mvn(q, i).log_prob(z[i]) for i in range(B)])
    torch.testing.assert_close(log_w, expected, rtol=1e-10, atol=1e-10)


def test_fullcov_cross_densities_are_the_mixture_of_its_posteriors():
    q = random_fullcov(7)
    z = torch.randn(9, Z, dtype=F64, generator=gen(8)) * 2
    brute = torch.logsumexp(torch.stack([mvn(q, j).log_prob(z) for j in range(B)]), 0) - math.log(B)
    torch.testing.assert_close(q.log_mixture(z, log_aggregate_posterior, 2**20), brute, rtol=1e-10, atol=1e-10)
    # small blocks (3 rows at a time) give the same values
    torch.testing.assert_close(q.log_mixture(z, log_aggregate_posterior, 3 * B), brute, rtol=1e-12, atol=1e-12)


def test_fullcov_with_a_diagonal_noise_block_is_the_diagonal_posterior():
    g = gen(9)
    mu, sigma = torch.randn(B, Z, generator=g, dtype=F64), torch.rand(Z, generator=g, dtype=F64) + 0.5
    full, diag = FullCovGaussian(mu, torch.diag(sigma)), DiagonalGaussian(mu, (2 * sigma.log()).expand(B, Z))
    z_full, z_diag = full.sample(3, gen(10)), diag.sample(3, gen(10))
    torch.testing.assert_close(z_full, z_diag, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(full.log_prob(z_full), diag.log_prob(z_full), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full.kl(), diag.kl(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full.marginal_kl(), diag.marginal_kl(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full.neg_entropy(), diag.neg_entropy(), rtol=1e-12, atol=1e-12)
    mi_full = posterior_mutual_information(full, gen(11), samples=4)
    mi_diag = posterior_mutual_information(diag, gen(11), samples=4)
    torch.testing.assert_close(mi_full, mi_diag, rtol=1e-10, atol=1e-10)
    # and the layers: iVAE's Linear on [h; ε] with ε block I and no bias is the diagonal layer
    # whose log σ² rows are zero
    h = torch.randn(B, 6, generator=g, dtype=F64)
    fc, gauss = FullCovGaussianPosterior().layer(6, Z).double(), GaussianPosterior().layer(6, Z).double()
    with torch.no_grad():
        gauss.weight[Z:] = 0
        fc.weight[:, :6], fc.weight[:, 6:], fc.bias[:] = gauss.weight[:Z], torch.eye(Z, dtype=F64), 0
    q_fc, q_g = FullCovGaussianPosterior().distribution(fc, h).double(), GaussianPosterior().distribution(gauss, h).double()
    z = q_fc.sample(3, gen(14))
    torch.testing.assert_close(z, q_g.sample(3, gen(14)), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q_fc.log_prob(z), q_g.log_prob(z), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(q_fc.kl(), q_g.kl(), rtol=1e-6, atol=1e-6)


def test_fullcov_layer_is_a_linear_map_of_h_and_the_noise():
    g = gen(12)
    layer = FullCovGaussianPosterior().layer(6, Z)
    h, eps = torch.randn(B, 6, generator=g), torch.randn(B, 1, Z, generator=gen(13))
    q = FullCovGaussianPosterior().distribution(layer, h)
    expected = layer(torch.cat([h, eps[:, 0]], dim=-1))  # z = W·[h; ε] + b
    torch.testing.assert_close(q.sample(1, gen(13)), expected.unsqueeze(1), rtol=1e-5, atol=1e-6)


def test_a_penalty_that_needs_the_kl_per_dimension_is_refused_with_the_full_covariance():
    for penalty in (FreeBits(4.0), BatchFreeBits(4.0)):
        with pytest.raises(ConfigError, match=r"^model.kl_penalty: .*FreeBits needs the KL per latent dimension"):
            SeqVAE(vocab_size=20, hidden_dim=12, latent_dim=Z, kl_penalty=penalty, posterior=FullCovGaussianPosterior())
    SeqVAE(vocab_size=20, embed_dim=8, hidden_dim=12, latent_dim=Z, kl_penalty=StandardKL(), posterior=FullCovGaussianPosterior())


def test_a_fullcov_model_round_trips_through_a_weights_only_checkpoint(tmp_path):
    import pytorch_lightning as pl

    torch.manual_seed(0)
    model = SeqVAE(vocab_size=20, embed_dim=8, hidden_dim=12, latent_dim=Z, posterior=FullCovGaussianPosterior(), bn_gamma=0.5)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, accelerator="cpu")
    trainer.strategy.connect(model)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = SeqVAE.load_from_checkpoint(tmp_path / "m.ckpt", map_location="cpu", weights_only=True)
    assert type(loaded.encoder.posterior) is FullCovGaussianPosterior
    tokens, lengths = torch.tensor([[1, 5, 6, 2], [1, 7, 2, 0]]), torch.tensor([4, 3])
    model.eval(), loaded.eval()
    for a, b in zip(model.encoder(tokens, lengths), loaded.encoder(tokens, lengths)):
        assert torch.equal(a, b)


LOADER_ONLY = """
import sys
from seqvae.store.checkpoints import load_checkpoint
names = sorted(type(v).__name__ for v in load_checkpoint(sys.argv[1], "test")["strategies"])
print(",".join(names))
"""


def test_every_strategy_class_in_the_package_loads_from_a_weights_only_checkpoint(tmp_path):
    import seqvae.cli  # noqa: F401  (every module a run can name a strategy from)

    classes = [c for c in STRATEGIES.values() if c.__module__.startswith("seqvae.")]
    names = {c.__name__ for c in classes}
    assert {"FullCovGaussianPosterior", "GaussianPosterior", "FreeBits", "LinearKLWarmup", "IsoBN"} <= names
    torch.save({"strategies": [c() for c in classes]}, tmp_path / "all.ckpt")
    # a fresh process that imports the loader alone: a class whose module the loader does not
    # import (so it never declared itself there) is refused
    out = subprocess.run([sys.executable, "-c", LOADER_ONLY, str(tmp_path / "all.ckpt")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [",".join(sorted(c.__name__ for c in classes))]


def test_fullcov_fits_tests_and_compares_with_only_its_config(tmp_path, capsys):
    from test_model import write_corpus

    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 40, seed)
    common = [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tmp_path / 'train.txt'}",
              f"--data.val={tmp_path / 'valid.txt'}", f"--data.test={tmp_path / 'test.txt'}", "--model.test_iw_samples=3",
              "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", *TINY]  # fmt: skip
    fullcov = [f"--config={CONFIGS / 'posteriors' / 'fullcov.yaml'}"]
    status, err = run(["fit", *common, *fullcov, "--trainer.logger.init_args.version=fullcov"], capsys)
    assert status == 0, err
    status, err = run(["fit", *common, "--trainer.logger.init_args.version=diag"], capsys)
    assert status == 0, err
    run_dir = tmp_path / "runs" / "demo" / "fullcov"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["test/iw_nll"] <= metrics["test/loss"]  # SPEC §11 check 4: IW-NLL(K) ≤ rec + closed-form KL
    status, err = run(["test", f"--config={run_dir / 'config.yaml'}", f"--ckpt_path={run_dir / 'checkpoints' / 'best.ckpt'}",
                       f"--trainer.logger.init_args.save_dir={tmp_path / 'retest'}"], capsys)  # fmt: skip
    assert status == 0, err
    again = json.loads(next((tmp_path / "retest").rglob("metrics.json")).read_text())
    assert again["test/iw_nll"] == metrics["test/iw_nll"] and again["test/mi_dataset"] == metrics["test/mi_dataset"]
    status, err = run(["compare", str(tmp_path / "runs" / "demo" / "*"), "--format", "json"], capsys)
    assert status == 0, err
    # a refused penalty: one line, exit 2, no run directory
    refused = ["--model.kl_penalty=seqvae.FreeBits", "--trainer.logger.init_args.version=no"]
    status, err = run(["fit", *common, *fullcov, *refused], capsys)
    assert status == 2 and err.strip().count("\n") == 0 and "FreeBits needs the KL per latent dimension" in err
    assert not (tmp_path / "runs" / "demo" / "no").exists()


def test_runs_without_model_posterior_group_with_its_null_and_not_with_the_full_covariance(tmp_path):
    from test_compare import make_run, metrics

    from seqvae.analysis import compare

    old = make_run(tmp_path, "max", 1, metrics(400.0, 60.0))  # written before model.posterior existed
    new = make_run(tmp_path, "max", 2, metrics(402.0, 60.0), posterior=None)
    groups = compare.group_runs(compare.find_runs([str(old), str(new)]))
    assert len(groups) == 1 and groups[0]["stats"]["iw_nll"]["mean"] == 401.0
    full = make_run(tmp_path, "fullcov", 1, metrics(399.0, 60.0), posterior={"class_path": "seqvae.FullCovGaussianPosterior"})
    assert len(compare.group_runs(compare.find_runs([str(old), str(new), str(full)]))) == 2
