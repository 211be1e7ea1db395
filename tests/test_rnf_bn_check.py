"""WAE-RNF's BatchNorm heads checked at every evaluation (`seqvae/core/rnf_bn_check.py`): the record's
root-mean-square distance of the texts from the running mean, in running s.d., against an
independent computation; the warning line when it passes 3; silence and no † when the running
statistics fit the texts; the record through a checkpoint; `seqvae compare`'s † and footnote."""

from __future__ import annotations

import json

import pytest
import torch
from test_compare import make_run, md_rows, metrics, run_compare
from test_model import corpus, datamodule, tiny_model, trainer  # noqa: F401  (fixtures and helpers)

from seqvae import PlanarFlowPosterior, SeqVAE
from seqvae.core.rnf_bn_check import FLOOR, RATIO, heads_record


def rnf_model(vocab_size, batch_norm=True):
    torch.manual_seed(0)
    return tiny_model(vocab_size, pooling="last", posterior=PlanarFlowPosterior(flows=1, batch_norm=batch_norm))


def pre_bn_heads(model, dm) -> tuple[torch.Tensor, torch.Tensor]:
    """Every test text's pre-BatchNorm head values (mu, log σ²), computed here from the features."""
    model.eval()
    dm.setup("test")
    layer = model.encoder.to_posterior
    with torch.no_grad():
        rows = [torch.nn.Linear.forward(layer, model.encoder.features(b["tokens"], b["lengths"])) for b in dm.test_dataloader()]
    return torch.cat(rows).double().chunk(2, dim=-1)


def expected_rms(x: torch.Tensor, norm) -> torch.Tensor:
    return ((x - norm.running_mean.double()) ** 2).mean(0).sqrt() / (norm.running_var.double() + norm.eps).sqrt()


def fit_running_statistics(model, dm):
    """Running statistics equal to the test texts' own mean and variance: the texts sit within 1 s.d."""
    layer = model.encoder.to_posterior
    for x, norm in zip(pre_bn_heads(model, dm), (layer.mu_norm, layer.logvar_norm)):
        norm.running_mean.copy_(x.mean(0))
        norm.running_var.copy_(x.var(0))


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("seqvae: warning: WAE-RNF")]


def test_texts_far_from_a_tiny_running_variance_warn_with_the_exact_distance(corpus, tmp_path, capsys):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = rnf_model(dm.vocab_size)
    fit_running_statistics(model, dm)
    norm = model.encoder.to_posterior.logvar_norm
    norm.running_var[2] = 1e-9  # training's batches of one length saw almost no spread in this dimension,
    norm.running_mean[2] += 0.05  # and the texts' mean moved away from the running mean: ~0.05/√ε s.d.
    capsys.readouterr()
    trainer(tmp_path).test(model, dm)
    (line,) = warnings_in(capsys.readouterr().err)
    record = model.run_flags()["rnf_bn_heads"]
    assert record["broken"] is True and record["dims"] == {"mu": [], "logvar": [2]}
    assert record["stage"] == "test" and record["texts"] == 40 and (record["ratio"], record["floor"]) == (RATIO, FLOOR)
    mu, logvar = pre_bn_heads(model, dm)
    rms = expected_rms(logvar, norm)
    assert record["max_rms_running_sd"]["logvar"] == pytest.approx(float(rms.max()), rel=1e-9)
    assert record["max_rms_running_sd"]["logvar"] == pytest.approx(float(rms[2]), rel=1e-9) and rms[2] > RATIO
    assert record["median_rms_running_sd"]["mu"] == pytest.approx(
        float(expected_rms(mu, model.encoder.to_posterior.mu_norm).quantile(0.5)), rel=1e-9
    )
    assert line.startswith(
        "seqvae: warning: WAE-RNF's BatchNorm heads are evaluated unlike in training at test: the 40 test texts"
    )
    assert "over 3 times as far from the running mean as training's batches and over 1 running s.d." in line
    assert "in dimensions of the log σ² head (1: 2) (of 4 per head)" in line and f"up to {float(rms[2]):.3g})" in line
    assert "data.batching: bucket" in line and "scripts/rnf_bn_heads.py" in line and "metrics.json: rnf_bn_heads" in line
    json.dumps(model.run_flags(), allow_nan=False)  # plain JSON for metrics.json


def test_running_statistics_that_fit_the_texts_say_nothing_and_a_checkpoint_keeps_the_record(corpus, tmp_path, capsys):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root, batching="padded")
    model = rnf_model(dm.vocab_size)
    fit_running_statistics(model, dm)
    t = trainer(tmp_path)
    capsys.readouterr()
    t.test(model, dm)
    assert warnings_in(capsys.readouterr().err) == []
    record = model.checks["rnf_bn_heads"]
    assert record["broken"] is False and record["dims"] == {"mu": [], "logvar": []}
    # the running variance is the texts' own (divisor n − 1): RMS = √((n − 1)/n · v/(v + ε)) < 1
    layer = model.encoder.to_posterior
    for head, x, norm in zip(("mu", "logvar"), pre_bn_heads(model, dm), (layer.mu_norm, layer.logvar_norm)):
        v = x.var(0)
        assert record["max_rms_running_sd"][head] == pytest.approx(
            float(((x.size(0) - 1) / x.size(0) * v / (v + norm.eps)).sqrt().max()), rel=1e-6
        )
        assert record["max_rms_running_sd"][head] < 1
    t.save_checkpoint(tmp_path / "fit.ckpt")
    fresh = SeqVAE.load_from_checkpoint(tmp_path / "fit.ckpt")
    assert fresh.run_flags() == {"rnf_bn_heads": record}


def test_validation_warns_once_per_set_of_dimensions(corpus, tmp_path, capsys):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = rnf_model(dm.vocab_size)
    model.encoder.to_posterior.mu_norm.running_var.fill_(1e-9)  # every mean dimension,
    model.encoder.to_posterior.mu_norm.running_mean.add_(0.05)  # 0.05 off the untrained texts' values
    t = trainer(tmp_path)
    capsys.readouterr()
    t.validate(model, dm)
    t.validate(model, dm)
    (line,) = warnings_in(capsys.readouterr().err)
    assert "at validation (epoch 1)" in line and "the 40 validation texts" in line
    assert model.checks["rnf_bn_heads"]["dims"]["mu"] == [0, 1, 2, 3]


def test_no_record_without_the_heads_batch_norm(corpus, tmp_path):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = rnf_model(dm.vocab_size, batch_norm=False)
    trainer(tmp_path).test(model, dm)
    assert model.run_flags() == {} and model.checks == {} and model.eval_checks() == []


def moments_of(x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    x = x.double()
    return x.size(0), x.mean(0), x.var(0)


def norm_with(mean: list[float], var: list[float]) -> torch.nn.BatchNorm1d:
    bn = torch.nn.BatchNorm1d(len(mean))
    bn.running_mean.copy_(torch.tensor(mean))
    bn.running_var.copy_(torch.tensor(var))
    return bn


def test_the_rule_compares_with_trainings_spread_and_leaves_near_constant_dimensions_alone():
    eps = 1e-5
    # dim 0: training spread ~1 (rv 1), texts at RMS 2: not flagged (under 3 times training's);
    # dim 1: training spread √(1e-7/(1e-7+ε)) ≈ 0.1, texts at RMS 2: flagged (over 3 times, over 1 s.d.);
    # dim 2: training spread ≈ 0.1, texts at RMS 0.5 (≈ 5 times training's): left alone, under FLOOR
    x = torch.tensor(
        [
            [-2.0, -2.0 * (1e-7 + eps) ** 0.5, -0.5 * (1e-7 + eps) ** 0.5],
            [2.0, 2.0 * (1e-7 + eps) ** 0.5, 0.5 * (1e-7 + eps) ** 0.5],
        ]
    )
    x = x.repeat(50, 1)  # 100 texts, mean 0, RMS 2, 2 and 0.5 running s.d. from a running mean of 0
    bn = norm_with([0.0, 0.0, 0.0], [1.0 - eps, 1e-7, 1e-7])
    r = heads_record({"mu": moments_of(x), "logvar": moments_of(x)}, {"mu": bn, "logvar": bn}, "test", 0)
    assert r["dims"] == {"mu": [1], "logvar": [1]} and r["broken"] is True
    assert r["max_rms_running_sd"]["mu"] == pytest.approx(2.0, rel=1e-6)
    assert r["median_rms_running_sd"]["mu"] == pytest.approx(2.0, rel=1e-6)
    assert r["median_training_rms"]["mu"] == pytest.approx((1e-7 / (1e-7 + eps)) ** 0.5, rel=1e-6)


def trained_norm(batches) -> torch.nn.BatchNorm1d:
    bn = torch.nn.BatchNorm1d(16).train()
    for b in batches:
        bn(b)
    return bn.eval()


def test_random_batches_read_about_one_and_batches_of_one_length_are_flagged():
    # the rationale, on a BatchNorm trained as a head's would be: 16 dimensions, 8 "lengths" whose
    # means differ by 10 times the spread within one length
    g = torch.Generator().manual_seed(0)
    centre = torch.randn(8, 16, generator=g) * 0.01

    def texts(length, n):  # noqa: E306
        return centre[length] + 0.001 * torch.randn(n, 16, generator=g)

    lengths = torch.randint(0, 8, (400, 8), generator=g)
    mixed = trained_norm(torch.stack([texts(int(k), 1)[0] for k in row]) for row in lengths)  # random batches
    bucketed = trained_norm(texts(int(row[0]), 8) for row in lengths)  # each batch of one length
    evaluation = torch.cat([texts(k, 50) for k in range(8)])
    for bn, broken in ((mixed, False), (bucketed, True)):
        r = heads_record({"mu": moments_of(evaluation), "logvar": moments_of(evaluation)}, {"mu": bn, "logvar": bn}, "val", 0)
        assert r["broken"] is broken, r
    assert r["dims"]["mu"] == list(range(16))  # every dimension of the bucketed one
    mixed_rms = heads_record(
        {"mu": moments_of(evaluation), "logvar": moments_of(evaluation)}, {"mu": mixed, "logvar": mixed}, "val", 0
    )
    assert mixed_rms["max_rms_running_sd"]["mu"] < 1.5


# ------------------------------------------------------------------------------------- compare
def test_compare_marks_a_run_whose_heads_check_broke_with_the_records_own_footnote(tmp_path, capsys):
    from seqvae.core.rnf_bn_check import CONSEQUENCE, TITLE

    broken = {"broken": True, "dims": {"mu": [], "logvar": [2]}, "title": TITLE, "consequence": CONSEQUENCE}
    healthy = {**broken, "broken": False, "dims": {"mu": [], "logvar": []}}
    for seed in (1, 2, 3):
        make_run(
            tmp_path, "rnf", seed, metrics(90.0 + seed, 60.0) | {"rnf_bn_heads": broken if seed == 2 else healthy}, latent_dim=16
        )
        make_run(tmp_path, "base", seed, metrics(95.0 + seed, 60.0), latent_dim=8)
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir")
    assert rc == 0
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    rows = md_rows(out)
    kl, cos = headers.index("KL"), headers.index("feature cos")
    assert set(rows) == {"rnf", "base"}, out
    assert rows["rnf"][kl].endswith("†") and not rows["rnf"][cos].endswith("†") and not rows["base"][kl].endswith("†")
    assert lines[-1] == f"- † {TITLE} in runs rnf (seed2): see metrics.json rnf_bn_heads; {CONSEQUENCE}", out
    rc, out, _ = run_compare(capsys, f"{tmp_path}/yahoo/*/seed*", "--label", "dir", "--format", "json")
    by_label = {r["label"]: r for r in json.loads(out)["rows"]}
    assert [r.get("rnf_bn_heads") for r in by_label["rnf"]["runs"]] == [healthy, broken, healthy]
