"""AIS (`seqvae/core/ais.py`) against SPEC §14's checks: the one-transition schedule is the IW
estimate with prior draws, a decoder that ignores z gives its exact log p(x), a linear-Gaussian toy
lands on its exact log p(x), the HMC kernel leaves N(0, I) invariant (and He et al.'s in-place
momentum scaling does not), the leapfrog is reversible, the gradient count is K·(1 + (T − 1)·L),
more points never loosen the bound; and `seqvae test --model.ais` end to end on a tiny run."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from seqvae.core import ais as ais_module
from seqvae.core.ais import AIS, ais_log_weights, decoder_ll_grad, hmc_transition, leapfrog, linear_schedule
from seqvae.core.metrics import iw_nll_from_weights
from seqvae.core.networks import LSTMDecoder

F64 = torch.float64
REPO = Path(__file__).resolve().parents[1]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class LinearGaussian:
    """p(z) = N(0, I_4), p(x|z) = N(Wz + b, 0.3² I_8): log p(x) = log N(x; b, WWᵀ + 0.09 I) exactly;
    W ~ N(0, 0.15²) per entry, x drawn from the model. (With W ~ N(0, 1) one run of T = 500, K = 16
    has an s.d. of 0.19 nats even with exact transitions in place of HMC: SPEC §14's 0.05 nats is
    then out of reach of any kernel; here one run's s.d. is 0.11 nats with HMC, and the check is of
    the mean of 20 runs.)"""

    def __init__(self, seed: int = 0, d: int = 4, n: int = 8, sigma: float = 0.3, scale: float = 0.15):
        g = gen(seed)
        self.w = scale * torch.randn(n, d, generator=g, dtype=F64)
        self.b = torch.randn(n, generator=g, dtype=F64)
        self.x = self.w @ torch.randn(d, generator=g, dtype=F64) + self.b + sigma * torch.randn(n, generator=g, dtype=F64)
        self.var, self.calls = sigma**2, 0

    def ll_grad(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        r = self.x - z @ self.w.T - self.b  # (B, K, n)
        ll = -0.5 * (r * r).sum(-1) / self.var - 0.5 * r.size(-1) * math.log(2 * math.pi * self.var)
        return ll, r @ self.w / self.var

    def exact(self) -> float:
        cov = self.w @ self.w.T + self.var * torch.eye(self.w.size(0), dtype=F64)
        return float(torch.distributions.MultivariateNormal(self.b, cov).log_prob(self.x))


def log_p_hat(log_w: torch.Tensor) -> torch.Tensor:
    return -iw_nll_from_weights(log_w)


@pytest.fixture(scope="module")
def toy_runs():
    """20 independent AIS runs (K = 16 chains each) on one toy x, for T = 2, 10, 100, 500 points."""
    toy = LinearGaussian()
    runs = {}
    for points in (2, 10, 100, 500):
        z0 = torch.randn(20, 16, 4, generator=gen(points), dtype=F64)
        log_w, _ = ais_log_weights(toy.ll_grad, z0, linear_schedule(points), gen(1000 + points))
        runs[points] = log_p_hat(log_w)
    return toy.exact(), runs


def test_two_points_are_iw_with_prior_draws_exactly():
    toy = LinearGaussian()
    z0 = torch.randn(3, 7, 4, generator=gen(1), dtype=F64)
    log_w, _ = ais_log_weights(toy.ll_grad, z0, linear_schedule(2), gen(2))
    assert torch.equal(log_w, toy.ll_grad(z0)[0])  # log mean_k p(x|z_k) of the same z
    # and through the decoder: AIS(points=2) is the IW-NLL with K prior draws from its stream
    torch.manual_seed(0)
    decoder = LSTMDecoder(11, 6, 8, 4).eval()
    tokens = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    lengths = torch.tensor([5, 3])
    est = AIS(points=2, chains=5).estimate(decoder, tokens, lengths, 4, gen(3))
    z = torch.randn(2, 5, 4, generator=gen(3), dtype=F64).float()
    with torch.no_grad():
        iw = iw_nll_from_weights(decoder.log_likelihood(tokens, lengths, z).double())
    torch.testing.assert_close(est["nll"], iw, rtol=0, atol=1e-5)


def test_decoder_that_ignores_z_gives_its_exact_log_likelihood_with_no_spread():
    torch.manual_seed(0)
    decoder = LSTMDecoder(11, 6, 8, 4).eval()
    with torch.no_grad():
        decoder.z_to_c0.weight.zero_()
        decoder.lstm.weight_ih_l0[:, 6:].zero_()  # the LSTM's input columns that read z
    tokens = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 9, 2, 0]])
    lengths = torch.tensor([5, 4])
    with torch.no_grad():
        exact = -decoder.log_likelihood(tokens, lengths, torch.zeros(2, 1, 4))[:, 0].double()
    for points, chains in ((2, 1), (7, 4)):
        est = AIS(points=points, chains=chains, leapfrog=3).estimate(decoder, tokens, lengths, 4, gen(points))
        torch.testing.assert_close(est["nll"], exact, rtol=1e-12, atol=1e-9)
        if chains > 1:
            assert torch.equal(est["se"], torch.zeros(2, dtype=F64))


def test_linear_gaussian_toy_lands_on_the_exact_log_likelihood(toy_runs):
    exact, runs = toy_runs
    est = runs[500]  # 20 runs of T = 500, K = 16
    se = float(est.std()) / math.sqrt(est.numel())
    assert abs(float(est.mean()) - exact) < 0.05 and se < 0.03
    assert float(est.mean()) <= exact + 2 * se  # a lower bound on log p(x) in expectation


def test_more_points_never_loosen_the_bound(toy_runs):
    """E[log p̂] rises with T (2 points: the IW estimate with prior draws), within 2 s.e."""
    _, runs = toy_runs
    means = [(float(runs[p].mean()), float(runs[p].std()) / math.sqrt(20)) for p in (2, 10, 100, 500)]
    for (lo, lo_se), (hi, hi_se) in zip(means, means[1:]):
        assert hi >= lo - 2 * math.hypot(lo_se, hi_se)


def test_few_points_still_give_an_unbiased_estimate_of_p_x():
    """AIS's p̂ is unbiased for p(x) at any T (Neal 2001), not only as T grows: E[exp(log w)] / p(x) = 1. At T = 3
    a kernel aimed at the wrong temperature (t_{j−1} instead of t_j) biases it by ~11 % on this toy (W scale 0.45,
    2·10⁵ chains: the correct kernel gives 0.970 ± 0.020, that one 0.886 ± 0.019), which the T = 500 runs of the
    tests above cannot see."""
    toy = LinearGaussian(scale=0.45)
    z0 = torch.randn(1, 200_000, 4, generator=gen(3), dtype=F64)
    log_w, _ = ais_log_weights(toy.ll_grad, z0, linear_schedule(3), gen(1003))
    ratio = (log_w[0] - toy.exact()).exp()
    se = float(ratio.std()) / math.sqrt(ratio.numel())
    assert abs(float(ratio.mean()) - 1) < 3 * se, (float(ratio.mean()), se)


def run_chains(precision: float, transitions: int = 200, chains: int = 1000, dim: int = 32):
    """Chains on N(0, I / precision) (t = 1 of a Gaussian "likelihood"; precision 1: t = 0, the
    prior), started from exact draws, with the step size adaptation: (final z, each chain's
    acceptance rate, the chains' mean acceptance at each transition)."""
    z0 = torch.randn(chains, 1, dim, generator=gen(5), dtype=F64) / math.sqrt(precision)
    extra = precision - 1  # log p(x|z) = −½ (precision − 1) ‖z‖²
    ll_grad = lambda z: (-0.5 * extra * (z * z).sum(-1), -extra * z)  # noqa: E731
    z, rates, original = [], [], ais_module.hmc_transition

    def recorded(*args):
        out = original(*args)
        z[:] = [out[0]]
        rates.append(float(out[3].double().mean()))
        return out

    ais_module.hmc_transition = recorded
    try:
        _, accept = ais_log_weights(ll_grad, z0, torch.ones(transitions + 1, dtype=F64), gen(6))
    finally:
        ais_module.hmc_transition = original
    return z[0], accept, rates


def test_hmc_leaves_the_standard_normal_invariant():
    z, _, _ = run_chains(1.0)
    assert abs(float(z.mean())) < 0.02 and abs(float(z.var()) - 1) < 0.03


def test_step_size_adaptation_settles_the_acceptance_rate():
    """On N(0, 0.1² I) (the step size within its clamp [1e-4, 0.5]) each chain's acceptance rate
    over 400 transitions is within 0.55–0.80, and the draws keep their variance. The rule (SPEC
    §14.2, as BDMC) steers the rate since the start, not the recent one, so the step size cycles:
    the transitions' acceptance swings from ~0 to ~1 over ~200 transitions. (On N(0, I), SPEC
    §14's own target, the step size reaches the clamp at 0.5 after ~200 transitions, where the
    acceptance is 0.87 at d = 32: the clamp, not the adaptation, sets it there.)"""
    z, accept, rates = run_chains(100.0, transitions=400, chains=200)
    assert 0.55 <= float(accept.min()) and float(accept.max()) <= 0.80
    assert min(rates) < 0.1 and max(rates) > 0.9  # the cycle
    assert abs(float(z.var()) * 100 - 1) < 0.06


def test_in_place_momentum_scaling_of_he_et_al_fails_the_invariance_check(monkeypatch):
    """SPEC §14.5: `v` scaled in place by ε inside the position update (eval_ais/hmc.py:30) shrinks
    the momentum at every step; the same check then fails (the variance drifts)."""

    def defective(z, v, grad_ll, t, eps, steps, ll_grad):
        v = v - 0.5 * eps * (z - t * grad_ll)
        for i in range(steps):
            v = v * eps  # the in-place `v.mul_(eps)` before the position update
            z = z + v
            ll, grad_ll = ll_grad(z)
            v = v - (eps if i < steps - 1 else 0.5 * eps) * (z - t * grad_ll)
        return z, -v, ll, grad_ll

    monkeypatch.setattr(ais_module, "leapfrog", defective)
    z, _, _ = run_chains(1.0)
    assert abs(float(z.var()) - 1) > 0.03


def test_leapfrog_is_reversible():
    toy = LinearGaussian()
    z0 = torch.randn(3, 2, 4, generator=gen(7), dtype=F64)
    v0 = torch.randn(3, 2, 4, generator=gen(8), dtype=F64)
    eps = torch.rand(3, 2, 1, generator=gen(9), dtype=F64) * 0.05 + 0.01
    _, g0 = toy.ll_grad(z0)
    z1, v1, _, g1 = leapfrog(z0, v0, g0, 0.7, eps, 10, toy.ll_grad)  # ends with the momentum negated
    z2, v2, _, _ = leapfrog(z1, v1, g1, 0.7, eps, 10, toy.ll_grad)
    assert float((z1 - z0).abs().max()) > 0.01  # it moved
    assert float((z2 - z0).abs().max()) < 1e-10 and float((v2 - v0).abs().max()) < 1e-10


def test_gradient_evaluations_per_text():
    toy = LinearGaussian()
    ais = AIS(points=13, chains=3, leapfrog=4)
    ais.log_weights(toy.ll_grad, (5, 3, 4), "cpu", gen(0))
    # each call evaluates every text's K chains; the first gradient is the only one not carried over
    assert toy.calls == 1 + 12 * 4 and ais.gradient_evaluations() == 3 * toy.calls


def test_hmc_rejects_a_proposal_of_non_finite_energy():
    z = torch.zeros(1, 2, 3, dtype=F64)
    nan_ll = lambda z: (torch.full(z.shape[:-1], math.nan, dtype=F64), torch.zeros_like(z))  # noqa: E731
    ll0, eps = torch.zeros(1, 2, dtype=F64), torch.full((1, 2, 1), 0.1, dtype=F64)
    out, ll, _, accept = hmc_transition(z, ll0, torch.zeros_like(z), 0.5, eps, 3, nan_ll, gen(0))
    assert not bool(accept.any()) and torch.equal(out, z) and torch.equal(ll, torch.zeros(1, 2, dtype=F64))


def test_decoder_gradient_is_that_of_its_log_likelihood():
    """Each text's and chain's gradient against central differences along a direction (float64)."""
    torch.manual_seed(0)
    decoder = LSTMDecoder(11, 6, 8, 4, init="pytorch").eval().double()  # weights large enough for a visible gradient
    tokens, lengths = torch.tensor([[1, 5, 6, 7, 2], [1, 9, 2, 0, 0]]), torch.tensor([5, 3])
    z = torch.randn(2, 3, 4, generator=gen(1), dtype=F64)
    ll, grad = decoder_ll_grad(decoder, tokens, lengths)(z)
    step = 1e-5 * torch.randn(2, 3, 4, generator=gen(2), dtype=F64)
    with torch.no_grad():
        plus, minus = (decoder.log_likelihood(tokens, lengths, z + s) for s in (step, -step))
        assert torch.equal(ll, decoder.log_likelihood(tokens, lengths, z))
    torch.testing.assert_close((grad * step).sum(-1), (plus - minus) / 2, rtol=1e-6, atol=1e-12)
    assert float((grad * step).sum(-1).abs().min()) > 1e-8


# ------------------------------------------------------------------------------------- CLI
def test_cli_test_with_ais_writes_ais_nll(tmp_path, monkeypatch, capsys):
    """`seqvae fit` a tiny model, then `seqvae test --ckpt_path best.ckpt --model.ais …`, each in a
    process of its own: run inside the test process, Lightning's trainer left state behind that made a
    later test (test_bn_bound's trained BN-VAE) train another model."""

    def run_lightning(args: list[str]) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-m", "seqvae", *args], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr

    monkeypatch.chdir(tmp_path)
    words = "the a cat dog sat ran on mat under tree".split()
    g = torch.Generator().manual_seed(0)
    for name, n in (("train", 40), ("valid", 8), ("test", 6)):
        lengths = torch.randint(2, 6, (n,), generator=g).tolist()
        lines = [" ".join(words[i] for i in torch.randint(10, (k,), generator=g).tolist()) for k in lengths]
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    common = ["--config", REPO / "configs" / "demo.yaml", "--data.train", tmp_path / "train.txt",
              "--data.val", tmp_path / "valid.txt", "--data.test", tmp_path / "test.txt", "--data.batch_size", "4",
              "--model.embed_dim", "8", "--model.hidden_dim", "12", "--model.latent_dim", "3",
              "--model.val_iw_samples", "0", "--model.test_iw_samples", "2", "--trainer.enable_model_summary", "false",
              "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", tmp_path / "runs"]  # fmt: skip
    run_lightning([str(a) for a in ["fit", *common, "--trainer.max_epochs", "1"]])
    ckpt = next((tmp_path / "runs").rglob("best.ckpt"))
    ais = ["--model.ais", "seqvae.AIS", "--model.ais.points", "4", "--model.ais.chains", "2", "--model.ais.leapfrog", "2"]
    out, err = run_lightning([str(a) for a in ["test", *common, "--ckpt_path", ckpt, *ais]])
    said = "IW-NLL with K = 2 importance samples per text; AIS with 2 chains, 4 points, 14 gradients per text"
    assert f"seqvae: test: 6 texts, {said}" in err.splitlines(), err
    metrics_path = Path(out.split("seqvae: wrote ")[1].split()[0])
    metrics = json.loads(metrics_path.read_text())
    rows = list(csv.DictReader(open(metrics_path.parent / metrics["per_text_file"])))
    assert len(rows) == 6 and list(rows[0])[-2:] == ["ais_nll", "ais_se"]
    assert metrics["test/ais_nll"] == pytest.approx(sum(float(r["ais_nll"]) for r in rows) / 6, rel=1e-5)
    assert math.isfinite(metrics["test/ais_nll_se"]) and 0 <= metrics["test/ais_accept"] <= 1
    assert metrics["test/ais_seconds_per_text"] > 0
    assert "  ais: null" in (metrics_path.parent.parent / "version_0" / "config.yaml").read_text()  # the fit's own run
    config = (metrics_path.parent / "config.yaml").read_text()
    assert "class_path: seqvae.AIS" in config and "points: 4" in config  # this test's setting, not the checkpoint's


def test_progress_line_moves_within_a_long_batch(monkeypatch, capsys):
    """One batch of AIS: the test's line comes from AIS's share of the batch, with its time left."""
    from torch.utils.data import DataLoader

    from seqvae.text.corpus import IndexedTexts, collate
    from seqvae.training import log_lines

    data = IndexedTexts([torch.full((n,), 7) for n in (4, 5, 6)])
    loader = DataLoader(data, batch_size=3, collate_fn=collate)
    trainer = SimpleNamespace(test_dataloaders=loader, is_global_zero=True)
    module = SimpleNamespace(hparams=SimpleNamespace(test_iw_samples=0), ais=AIS(points=3, chains=2, leapfrog=4))
    now = [0.0]
    monkeypatch.setattr(log_lines.time, "monotonic", lambda: now[0])
    progress = log_lines.TestProgress(quiet_seconds=0.0, min_interval=0.0)
    progress.on_test_epoch_start(trainer, module)
    batch = next(iter(loader))
    progress.on_test_batch_start(trainer, module, batch, 0)
    for share in (0.25, 0.5):
        now[0] = 400 * share
        module.ais_progress(share)
    header, *lines = capsys.readouterr().err.splitlines()
    said = "no IW-NLL (model.test_iw_samples 0); AIS with 2 chains, 3 points, 18 gradients per text"
    assert header == f"seqvae: test: 3 texts, {said}"
    # AIS's share of the batch is taken as the batch's share (its rec pass: 1 of 1 + 3 · 18 passes)
    assert lines == [
        "seqvae: test 25% (0/3 texts)  1:40 elapsed  ~5:00 left",
        "seqvae: test 50% (0/3 texts)  3:20 elapsed  ~3:20 left",
    ]
    assert AIS(points=3, chains=2, leapfrog=4).gradient_evaluations() == 2 * (1 + 2 * 4)


def test_out_of_range_ais_option_is_one_line_before_anything_is_built():
    from seqvae.cli import parse_only

    args = ["--config", str(REPO / "configs" / "demo.yaml"), "--model.ais", "seqvae.AIS", "--model.ais.points", "1"]
    assert parse_only(args) == "model.ais.init_args.points: must be >= 2, got 1"


def test_eval_metrics_with_ais_add_its_columns_and_means():
    from seqvae.core.metrics import EvalMetrics
    from seqvae.rundir.run_files import per_text_csv

    m = EvalMetrics(0, 1, per_text=True, ais=True)
    for idx, nll, se in (([2, 0], [10.0, 20.0], [0.3, 0.4]), ([1], [30.0], [float("nan")])):
        b = len(idx)
        ais = {"nll": torch.tensor(nll), "se": torch.tensor(se), "accept": torch.full((b,), 0.5), "seconds": 2.0 * b}
        m.update(torch.tensor(nll) + 1, torch.zeros(b), torch.full((b,), 4), index=torch.tensor(idx), ais=ais)
    out = m.compute()
    assert float(out["ais_nll"]) == pytest.approx(20.0) and float(out["ais_ppl"]) == pytest.approx(math.exp(60 / 12))
    assert float(out["ais_nll_se"]) == pytest.approx(0.5 / 2)  # texts with a finite se: √(0.3² + 0.4²) / 2
    assert float(out["ais_accept"]) == 0.5 and float(out["ais_seconds_per_text"]) == 2.0
    rows = m.per_text_rows()
    assert rows["ais_nll"].tolist() == [20.0, 30.0, 10.0] and list(rows)[-2:] == ["ais_nll", "ais_se"]
    header, first, *_ = per_text_csv(rows, [5, 6, 7]).splitlines()
    assert header.endswith(",iw_nll,iw_se,ais_nll,ais_se") and first.endswith(",nan,nan,20.000000,0.400000")
    plain = EvalMetrics(0, 1, per_text=True)  # without AIS: the columns and keys of before
    plain.update(torch.ones(1), torch.zeros(1), torch.full((1,), 4), index=torch.tensor([0]))
    assert "ais_nll" not in plain.per_text_rows() and "ais_nll" not in plain.compute()
    assert per_text_csv(plain.per_text_rows(), [1]).splitlines()[0] == "index,line,tokens,neg_elbo,kl,iw_nll,iw_se"


def test_out_of_range_ais_option_in_the_python_api():
    from seqvae.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model\.ais\.init_args\.target_accept: must be in \(0, 1\), got 1\.0$"):
        AIS(target_accept=1.0)
