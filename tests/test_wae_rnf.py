"""WAE-RNF as switches (issue 48 items 2, 3, 6; ../shared/SPEC.md §12): the planar-flow posterior
(0 flows = the Gaussian bit for bit; log-det = slogdet of the autograd Jacobian; the change of
variables; per-text independence of its IW-NLL), the MMD and centres penalties on constructed
inputs, the capped KL schedule, the reference's defective IW-NLL against the correct one, and
fit → test → `seqvae rnf-nll` end to end with the demo's WAE-RNF config."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_configs import CONFIGS
from test_scoring import TINY, run

from seqvae.analysis import estimator_gap
from seqvae.core.gaussian import DiagonalGaussian, log_standard_normal
from seqvae.core.metrics import iw_nll_from_weights, posterior_iw_log_weights
from seqvae.core.model import SeqVAE
from seqvae.core.planar_flow import PlanarFlow, PlanarFlowGaussian, PlanarFlowPosterior, planar_u_hat
from seqvae.core.posteriors import GaussianPosterior
from seqvae.core.schedules import CappedKLWarmup
from seqvae.core.wae_rnf import CentresPenalty, MMDPenalty, imq_kernel, mmd_gaussian, mmd_imq
from seqvae.errors import ConfigError
from seqvae.rnf_diagnostics import flow_iw_log_weights

F64 = torch.float64
TOKENS, LENGTHS = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0], [1, 8, 9, 10, 2]]), torch.tensor([4, 3, 5])


def gen(seed):
    return torch.Generator().manual_seed(seed)


def flow_with(u, w, b) -> PlanarFlow:
    flow = PlanarFlow(u.size(1), u.size(0)).to(u.dtype)
    with torch.no_grad():
        flow.u.copy_(u), flow.w.copy_(w), flow.b.copy_(b)
    return flow


def test_zero_flows_is_the_gaussian_posterior_bit_for_bit():
    models = []
    for posterior in (GaussianPosterior(), PlanarFlowPosterior(flows=0)):
        torch.manual_seed(0)
        models.append(
            SeqVAE(vocab_size=12, embed_dim=8, hidden_dim=12, latent_dim=4, posterior=posterior, dropout_in=0, dropout_out=0)
        )
    gauss, flow = models
    theirs = dict(flow.named_parameters())
    assert {n for n in theirs if n not in dict(gauss.named_parameters())} == {f"encoder.to_posterior.flow.{p}" for p in "uwb"}
    assert all(torch.equal(p, theirs[n]) for n, p in gauss.named_parameters())  # same layer, same draws
    batch = {"tokens": TOKENS, "lengths": LENGTHS}
    terms = []
    for m in models:
        torch.manual_seed(1)
        terms.append(m.loss_terms(batch, 0.7))
    assert all(torch.equal(terms[0][k], terms[1][k]) for k in ("loss", "rec", "kl"))
    (qg, _), (qf, _) = gauss.encoder.encode(TOKENS, LENGTHS), flow.encoder.encode(TOKENS, LENGTHS)
    assert torch.equal(qg.sample(6, gen(2)), qf.sample(6, gen(2)))
    assert torch.equal(qg.kl(), qf.kl()) and torch.equal(qg.mean, qf.mean)
    (zg, lg), (zf, lf) = qg.draw(6, gen(3)), qf.draw(6, gen(3))
    assert torch.equal(zg, zf) and torch.equal(lg, lf)
    ll = lambda m: lambda z: m.decoder.log_likelihood(TOKENS, LENGTHS, z)  # noqa: E731
    iw = [iw_nll_from_weights(posterior_iw_log_weights(ll(m), q, 7, 3, gen(4))) for m, q in ((gauss, qg), (flow, qf))]
    assert torch.equal(iw[0], iw[1])


def test_planar_log_det_is_the_slogdet_of_the_autograd_jacobian():
    g = gen(0)
    z_dim = 5
    u, w = torch.randn(3, z_dim, generator=g, dtype=F64), torch.randn(3, z_dim, generator=g, dtype=F64)
    b = torch.randn(3, generator=g, dtype=F64)
    # a u with wᵀu = −100 (far outside the invertible range): û brings wᵀû back above −1
    u[2] = u[2] - ((w[2] @ u[2] + 100) / (w[2] @ w[2])) * w[2]
    assert abs(float(w[2] @ u[2]) + 100) < 1e-9
    u_hat = planar_u_hat(u, w)
    assert bool(((w * u_hat).sum(-1) > -1).all())
    for k in range(3):
        layer = flow_with(u[k : k + 1], w[k : k + 1], b[k : k + 1])
        for z in torch.randn(4, z_dim, generator=g, dtype=F64) * 2:
            jac = torch.autograd.functional.jacobian(lambda x: layer(x)[0], z)
            sign, logabs = torch.linalg.slogdet(jac)
            assert float(sign) > 0
            assert abs(float(layer(z)[1]) - float(logabs)) < 1e-10
    # the layers composed: S is the sum, and the slogdet of the whole map's Jacobian
    flow = flow_with(u, w, b)
    z = torch.randn(z_dim, generator=g, dtype=F64)
    logabs = torch.linalg.slogdet(torch.autograd.functional.jacobian(lambda x: flow(x)[0], z)).logabsdet
    assert abs(float(flow(z)[1]) - float(logabs)) < 1e-10


def test_change_of_variables_the_importance_weights_of_the_prior_average_one():
    # SPEC §12 check 3: E_{q_K}[p(z_K)/q_K(z_K)] = 1 with log q_K = log q0 − S and the prior at z_K
    g = gen(5)
    flow = flow_with(torch.randn(3, 2, generator=g, dtype=F64), torch.randn(3, 2, generator=g, dtype=F64),
                     torch.randn(3, generator=g, dtype=F64))  # fmt: skip
    mu = torch.tensor([[0.3, -0.2]], dtype=F64)
    logvar = 2 * torch.tensor([[1.2, 1.45]], dtype=F64).log()  # σ in [1, 1.5]: p/q has a finite variance
    q = PlanarFlowGaussian(DiagonalGaussian(mu, logvar), flow)
    with torch.no_grad():
        z, log_q = q.draw(1_000_000, gen(6))
        ratio = (log_standard_normal(z) - log_q).exp()
    assert abs(float(ratio.mean()) - 1) < 0.01


def fixed_noise(q: PlanarFlowGaussian, eps: torch.Tensor) -> PlanarFlowGaussian:
    """q whose draws use the given ε (B, K, Z) instead of a generator's."""

    class Fixed(DiagonalGaussian):
        def sample(self, k, generator=None):
            return self.mu.unsqueeze(1) + (0.5 * self.logvar).exp().unsqueeze(1) * eps

    return PlanarFlowGaussian(Fixed(q.base.mu, q.base.logvar), q.flow)


def test_the_flow_iw_nll_of_a_text_does_not_depend_on_the_other_texts_of_its_batch():
    torch.manual_seed(0)
    posterior = PlanarFlowPosterior(flows=2, batch_norm=True, mmd=MMDPenalty(), centres=CentresPenalty())
    model = SeqVAE(vocab_size=12, embed_dim=8, hidden_dim=12, latent_dim=4, posterior=posterior).eval()
    k = 20
    eps = torch.randn(3, k, 4, generator=gen(1))
    with torch.no_grad():

        def both(tokens, lengths, e):
            q, _ = model.encoder.encode(tokens, lengths)
            ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
            correct, reference = flow_iw_log_weights(ll, fixed_noise(q, e), k, 7)
            assert torch.equal(correct, posterior_iw_log_weights(ll, fixed_noise(q, e), k, 7))  # the metric's own
            return iw_nll_from_weights(correct), iw_nll_from_weights(reference)

        batch, batch_ref = both(TOKENS, LENGTHS, eps)
        for i in range(3):
            n = int(LENGTHS[i])
            alone, alone_ref = both(TOKENS[i : i + 1, :n], LENGTHS[i : i + 1], eps[i : i + 1])
            assert abs(float(alone[0] - batch[i])) < 1e-5
            # the reference's gives every text the batch's mean likelihood: its number moves with the batch
            # (text 0 has the batch's mean length, 3 predicted tokens: under this untrained decoder, ~its mean likelihood)
            assert i == 0 or abs(float(alone_ref[0] - batch_ref[i])) > 1.0


def test_the_reference_estimator_shifts_each_log_weight_as_spec_12_5_says_and_mixes_texts():
    # b large: tanh ≈ 1, the layer is nearly the translation z + û (S ≈ 0); the prior at z0 then
    # sees points nearer its centre than z_K = z0 + û: the reference's weights are too large
    flow = flow_with(torch.tensor([[6.0, 0.0]], dtype=F64), torch.tensor([[0.5, 0.5]], dtype=F64), torch.tensor([6.0], dtype=F64))
    mu, logvar = torch.zeros(2, 2, dtype=F64), torch.full((2, 2), -3.0, dtype=F64)  # û ≈ (5.05, −0.95), σ ≈ 0.22
    q = PlanarFlowGaussian(DiagonalGaussian(mu, logvar), flow)
    own = torch.tensor([-3.0, -40.0], dtype=F64)  # each text's log p(x|z), constant in z

    def ll(z):
        return own.unsqueeze(1).expand(z.shape[:2])

    correct, reference = flow_iw_log_weights(ll, q, 50, 50, gen(8))
    z0 = q.base.sample(50, gen(8))
    zk, log_det, _ = flow(z0)
    shift = log_standard_normal(z0) - log_standard_normal(zk) - 2 * log_det  # SPEC §12.5, (a) and (b)
    mixed = own.mean() - own  # (c): the batch's mean likelihood instead of the text's own
    torch.testing.assert_close(reference - correct, shift + mixed.unsqueeze(1), rtol=0, atol=1e-12)
    assert bool((shift > 0).all())
    # text 0 (the likelier) is made worse by (c), text 1 better by far more than the shift
    nll, ref = iw_nll_from_weights(correct), iw_nll_from_weights(reference)
    assert float(ref[1]) < float(nll[1]) - 18 and float(ref[0]) > float(nll[0])
    # one text alone: (c) is gone and the reference's NLL is below the correct one (the shift)
    alone = PlanarFlowGaussian(DiagonalGaussian(mu[:1], logvar[:1]), flow)
    c1, r1 = flow_iw_log_weights(lambda z: own[:1].unsqueeze(1).expand(z.shape[:2]), alone, 50, 50, gen(8))
    assert float(iw_nll_from_weights(r1)[0]) < float(iw_nll_from_weights(c1)[0])


def test_mmd_kernels_and_the_centres_penalty_on_constructed_inputs():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=F64)
    y = torch.tensor([[0.0, 1.0], [2.0, 0.0]], dtype=F64)
    # 'g': exp(−10·d²/Z²), Z = 2: k = exp(−2.5·d²); mean over all pairs, diagonals included
    k = lambda d2: math.exp(-2.5 * d2)  # noqa: E731
    expected = (2 + 2 * k(1)) / 4 + (2 + 2 * k(5)) / 4 - 2 * (k(1) + k(4) + k(2) + k(1)) / 4
    assert abs(float(mmd_gaussian(x, y)) - expected) < 1e-12
    assert float(mmd_gaussian(x, x)) == 0.0
    # 'im': C_s = 2·Z·s = 4s, off-diagonal same-sample pairs over B(B−1), cross pairs over B²
    imq = lambda d2: sum(4 * s / (4 * s + d2) for s in (0.1, 0.2, 0.5, 1, 2, 5, 10))  # noqa: E731
    expected = (2 * imq(1) + 2 * imq(5)) / 2 - 2 * (imq(1) + imq(4) + imq(2) + imq(1)) / 4
    assert abs(float(mmd_imq(x, y)) - expected) < 1e-12
    assert float(mmd_imq(x[:1], y[:1])) == 0.0  # one text: no pairs
    # centres: one layer input at distance 3 from its nearest centre (the other at 5)
    centres = torch.tensor([[3.0, 0.0], [0.0, -5.0]], dtype=F64)
    z = torch.zeros(1, 1, 2, dtype=F64)
    im = CentresPenalty(reg="im", band=0.5)([z], centres)
    assert abs(float(im) - 0.5 * math.log(imq(9))) < 1e-12 and float(imq_kernel(torch.tensor(0.0), 2)) == 7.0
    g = CentresPenalty(reg="g", band=0.5)([z, z], centres)  # two layers: summed
    assert abs(float(g) + 2 * math.log(1 + math.exp(-4.5))) < 1e-12


def test_the_imq_mmd_of_two_standard_normal_batches_averages_zero():
    # SPEC §12 check 6: unbiased, so its mean over 200 seeds is 0 within 3 standard errors
    values = torch.stack([MMDPenalty(kernel="im")(torch.randn(32, 32, generator=gen(s)), gen(1000 + s)) for s in range(200)])
    assert abs(float(values.mean())) < 3 * float(values.std()) / math.sqrt(200)


def test_the_capped_warmup_is_the_references_schedule():
    # w = min(0.8, clip((t − 6000)/40000, 0, 1)) at 2000 updates per nominal epoch
    s = CappedKLWarmup(start=0.0, delay_epochs=3, warmup_epochs=20, max_weight=0.8)
    for t in (0, 5999, 6000, 6001, 26000, 37999, 38000, 38001, 96000):
        assert abs(s.weight(t, 2000, 48) - min(0.8, max(0.0, (t - 6000) / 40000))) < 1e-12
    he = CappedKLWarmup(start=0.1, delay_epochs=0, warmup_epochs=10, max_weight=1.0)
    assert he.weight(0, 100, 20) == 0.1 and abs(he.weight(500, 100, 20) - 0.55) < 1e-12 and he.weight(5000, 100, 20) == 1.0


def test_bn_vae_and_a_negative_flow_count_are_refused_with_the_flow_posterior():
    with pytest.raises(ConfigError, match="model.bn_gamma: .*PlanarFlowPosterior"):
        SeqVAE(vocab_size=12, embed_dim=8, hidden_dim=12, latent_dim=4, posterior=PlanarFlowPosterior(), bn_gamma=0.5)
    with pytest.raises(ConfigError, match="model.posterior.init_args.flows: must be >= 0"):
        SeqVAE(vocab_size=12, embed_dim=8, hidden_dim=12, latent_dim=4, posterior=PlanarFlowPosterior(flows=-1))


def test_wae_rnf_fits_tests_and_prints_both_estimators_with_only_its_config(tmp_path, capsys):
    from test_model import write_corpus

    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 40, seed)
    args = [f"--config={CONFIGS / 'demo.yaml'}", f"--config={CONFIGS / 'posteriors' / 'wae_rnf.yaml'}",
            f"--data.train={tmp_path / 'train.txt'}", f"--data.val={tmp_path / 'valid.txt'}",
            f"--data.test={tmp_path / 'test.txt'}", "--model.test_iw_samples=3", "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.logger.init_args.version=v", *TINY,
            "--model.pooling=last"]  # fmt: skip
    status, err = run(["fit", *args], capsys)
    assert status == 0, err
    run_dir = tmp_path / "runs" / "wae_rnf" / "v"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert all(math.isfinite(metrics[f"test/{k}"]) for k in ("iw_nll", "kl", "mi", "au", "loss"))
    assert metrics["test/iw_nll"] <= metrics["test/loss"] + 1.0  # K = 3: near −ELBO, below it in expectation
    heads = metrics["rnf_bn_heads"]  # the heads' BatchNorm checked at the test (`rnf_bn_check.py`)
    assert heads["stage"] == "test" and heads["texts"] == metrics["data"]["test"]["texts"]
    assert heads["broken"] == any(heads["dims"].values())
    from seqvae.commands import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["rnf-nll", str(run_dir), "--samples", "3"])
    printed = capsys.readouterr().out
    assert exit.value.code == 0 and "IW-NLL (correct" in printed and "reference − correct" in printed, printed
    # its IW-NLL from the same checkpoint and K as `seqvae test` (other draws): close to the test's
    correct = float(printed.split("each text's own likelihood): ")[1].split()[0])
    assert abs(correct - metrics["test/iw_nll"]) < 0.05 * metrics["test/iw_nll"]
    # both per text (--per-text): the same draws, so the by-text gap's mean is the printed one
    with pytest.raises(SystemExit) as exit:
        main(["rnf-nll", str(run_dir), "--samples", "3", "--per-text", str(run_dir / "rnf_nll.csv")])
    gap = float(capsys.readouterr().out.split("reference − correct: ")[1].split()[0])
    (entry,) = estimator_gap.gaps([str(run_dir)], "reference_iw_nll", "iw_nll", "rnf_nll.csv")
    (one,) = entry["runs"]
    assert exit.value.code == 0 and one["texts"] == metrics["data"]["test"]["texts"]
    assert one["by_text"]["diff"] == pytest.approx(gap, abs=1e-3) and one["by_text"]["lo"] < one["by_text"]["hi"]
    assert one["iw_nll"] == pytest.approx(correct, abs=1e-3)


def test_interpolate_runs_between_the_posterior_means_the_decoder_reads(monkeypatch):
    """WAE-RNF: the Python API's interpolation starts and ends at z_K = f(mu), the flow's image of the base
    means (what predict and reconstruct decode), not at the pre-flow means."""
    from seqvae.core import generation
    from seqvae.core.scoring import text_batches
    from seqvae.text.corpus import Vocabulary

    texts = ["the cat sat on the mat", "a dog ran under the rug"]
    vocab = Vocabulary.build([" ".join(texts).split()])
    torch.manual_seed(0)
    model = SeqVAE(vocab_size=len(vocab), embed_dim=8, hidden_dim=12, latent_dim=4, posterior=PlanarFlowPosterior(flows=2))
    model.vocab = vocab
    seen = []
    monkeypatch.setattr(generation, "decode", lambda model, z, n, *rest: seen.append(z) or [""] * n)
    model.interpolate(texts[0], texts[1], steps=3)
    model.eval()
    with torch.no_grad():
        b = next(text_batches(model, texts, 2))
        q, _ = model.encoder.encode(b["tokens"], b["lengths"])
    (z,) = seen
    torch.testing.assert_close(z[0], q.mean[0])
    torch.testing.assert_close(z[-1], q.mean[1])
    assert not torch.allclose(q.mean, q.params()[0])  # the flow moved the means: the old endpoints were wrong


def random_flow_posterior(seed: int, texts: int = 3, z_dim: int = 3) -> PlanarFlowGaussian:
    """Three random planar layers: two biased into tanh's tails (they mostly shift z, so log p(z_K) ≠ log p(z0))
    and one near 0 (it stretches: S ≠ 0), over a random diagonal Gaussian per text."""
    g = gen(seed)
    flow = flow_with(torch.randn(3, z_dim, generator=g, dtype=F64), torch.randn(3, z_dim, generator=g, dtype=F64),
                     torch.tensor([1.5, 0.3, -1.5], dtype=F64))  # fmt: skip
    mu = torch.randn(texts, z_dim, generator=g, dtype=F64)
    logvar = 0.5 * torch.randn(texts, z_dim, generator=g, dtype=F64)
    return PlanarFlowGaussian(DiagonalGaussian(mu, logvar), flow)


def test_the_flow_kl_is_the_monte_carlo_kl_of_q_k_with_the_prior_at_z_k():
    """q.kl() (training's KL term and test/kl) against E[log q0(z0) − S(z0) − log N(z_K)] computed here from
    torch.distributions on draws of its own (SPEC §12.6); the wrong variants (prior at z0, S added) are far off."""
    q = random_flow_posterior(7)
    n = 200_000
    with torch.no_grad():
        q.sample(n, gen(8))
        d = q.last_draw()
        correction = log_standard_normal(d.z0) - log_standard_normal(d.zk) - d.log_det  # (B, n)
        kl, kl_se = q.kl(), correction.std(1) / math.sqrt(n)
        sd = (0.5 * q.base.logvar).exp()
        z0 = q.base.mu.unsqueeze(1) + sd.unsqueeze(1) * torch.randn(3, n, 3, generator=gen(9), dtype=F64)
        zk, s, _ = q.flow(z0)
        log_q0 = torch.distributions.Normal(q.base.mu.unsqueeze(1), sd.unsqueeze(1)).log_prob(z0).sum(-1)
        log_p_zk = torch.distributions.Normal(0.0, 1.0).log_prob(zk).sum(-1)
        own = log_q0 - s - log_p_zk
    est, est_se = own.mean(1), own.std(1) / math.sqrt(n)
    tolerance = 4 * (kl_se**2 + est_se**2).sqrt()
    assert bool(((kl - est).abs() < tolerance).all()), (kl, est, tolerance)
    log_p_z0 = torch.distributions.Normal(0.0, 1.0).log_prob(z0).sum(-1)
    for wrong in (log_q0 - s - log_p_z0, log_q0 + s - log_p_zk):  # the prior at z0; S added, not subtracted
        assert bool(((wrong.mean(1) - est).abs() > 2 * tolerance).all())  # the check above would see them


def test_the_log_det_has_weight_one_in_the_training_loss_whatever_the_kl_weight():
    """SPEC §12.4: loss = rec + w·[log q0(z0) − log N(z_K)] − S (+ penalties): S at weight 1, not w. seqvae's
    w·kl() holds −w·S, `unweighted_log_det` adds −(1 − w)·S; together: w·(KL0 + log p(z0) − log p(z_K)) − S."""
    q = random_flow_posterior(11)
    posterior = PlanarFlowPosterior(flows=3, unweighted_log_det=True)
    with torch.no_grad():
        q.sample(1, gen(12))
        d = q.last_draw()
        for w in (0.0, 0.3, 0.8):
            total = w * q.kl().mean() + posterior.training_terms(q, w)["log_det"]
            kl_without_s = (q.base.kl() + log_standard_normal(d.z0[:, 0]) - log_standard_normal(d.zk[:, 0])).mean()
            expected = w * kl_without_s - d.log_det[:, 0].mean()
            assert abs(float(total - expected)) < 1e-12
        assert "log_det" not in PlanarFlowPosterior(flows=3).training_terms(q, 0.3)  # off unless asked (a β-ELBO then)


def test_a_decoder_that_ignores_z_gives_the_exact_nll_with_no_flow_and_a_bound_within_the_kl_with_flows():
    """SPEC §12 check 4: log p(x|z) = c for every z. With 0 flows and q0 = N(0, I) the IW-NLL is −c exactly;
    with random flows IW-NLL − (−c) = −log mean_k p(z_K)/q_K(z_K) lies in [0, KL(q_K ‖ p)] on average over texts."""
    c = torch.tensor([-40.0, -55.5, -71.25], dtype=F64)
    ll = lambda z: c.unsqueeze(1).expand(-1, z.size(1))  # noqa: E731
    prior = PlanarFlowGaussian(DiagonalGaussian(torch.zeros(3, 4, dtype=F64), torch.zeros(3, 4, dtype=F64)),
                               PlanarFlow(4, 0).to(F64))  # fmt: skip
    with torch.no_grad():
        exact = iw_nll_from_weights(posterior_iw_log_weights(ll, prior, 50, 7, gen(13)))
        assert float((exact + c).abs().max()) < 1e-6
        q = random_flow_posterior(14, z_dim=4)
        gaps = iw_nll_from_weights(posterior_iw_log_weights(ll, q, 50, 7, gen(15))) + c  # (B,) per text
        draws = torch.stack([iw_nll_from_weights(posterior_iw_log_weights(ll, q, 50, 7, gen(100 + r))) + c for r in range(200)])
        q.sample(20_000, gen(16))
        kl = q.kl()
    mean, se = draws.mean(0), draws.std(0) / math.sqrt(draws.size(0))
    assert bool((gaps.isfinite()).all())
    assert bool((mean > -3 * se).all()) and bool((mean < kl + 3 * se).all()), (mean, kl)
    assert bool((mean > 5 * se).all())  # the flows make q_K ≠ p: the bound is not the exact NLL
