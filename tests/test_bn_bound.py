"""BN-VAE's bound check (`seqvae/core/bn_bound.py`): the warning line and metrics.json's `bn_bound`
when the raw posterior means barely vary, silence for a healthy BN-VAE, and `seqvae compare`'s
† marks for runs whose bound broke."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch
from test_compare import make_run, md_rows, metrics, run_compare
from test_model import corpus, datamodule, tiny_model, trainer, write_corpus  # noqa: F401  (fixtures and helpers)

from seqvae import SeqVAE
from seqvae.analysis import compare
from seqvae.core.bn_bound import THRESHOLD

FLAT = [1, 3]  # the latent dimensions whose raw means the constructed encoder keeps nearly constant


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """The weights of a BN-VAE (γ 0.6, ε 1e-5, PyTorch's init) trained 2 epochs on the tiny corpus:
    its raw means vary by ~1e-2 in every dimension. (Untrained, the tiny encoder's features barely
    vary across texts: its raw means have a variance of ~1e-8..1e-5, below the threshold.)"""
    root = tmp_path_factory.mktemp("bn")
    write_corpus(root / "train.txt", 120, 0)
    write_corpus(root / "valid.txt", 40, 1)
    write_corpus(root / "test.txt", 40, 2)
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, bn_gamma=0.6, init="pytorch")
    trainer(root, max_epochs=2, limit_val_batches=0).fit(model, dm)
    return root, dm.vocab_size, {k: v.clone() for k, v in model.state_dict().items()}


def flat_model(healthy, dims=FLAT):
    """The healthy BN-VAE with its posterior layer's rows for the means of `dims` scaled by 1e-4:
    their raw means vary by ~1e-10 over the texts; BatchNorm's running statistics stay the trained ones."""
    root, vocab_size, state = healthy
    model = tiny_model(vocab_size, bn_gamma=0.6, init="pytorch")
    model.load_state_dict(state)
    with torch.no_grad():
        model.encoder.to_posterior.weight[dims] *= 1e-4  # rows 0..Z-1 give the means
    return model, datamodule(root)


def warnings_in(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("seqvae: warning: BN-VAE")]


def test_nearly_constant_raw_means_warn_once_and_set_the_flag(healthy, tmp_path, capsys):
    model, dm = flat_model(healthy)
    t = trainer(tmp_path)
    t.validate(model, dm)
    t.validate(model, dm)  # the same broken dimensions again: no second line
    val = model.checks["bn_bound"]
    t.test(model, dm)
    lines = warnings_in(capsys.readouterr().err)
    assert len(lines) == 2, lines  # the first validation's, and the test's
    assert lines[0].startswith("seqvae: warning: BN-VAE's bound does not hold at validation (epoch 1): ")
    test_line = lines[1]
    assert test_line.startswith("seqvae: warning: BN-VAE's bound does not hold at test: in 2 of 4 latent dimensions (1, 3) ")
    assert "less than 10·bn_eps" in test_line and "bn_eps = 1e-05" in test_line and "over the 40 test texts" in test_line
    assert "KL, AU, MI and IW-NLL of this run are not BN-VAE's: lower model.bn_eps" in test_line
    assert "prior s.d." not in test_line  # the running statistics still fit the texts' mean: nothing moved
    flag = model.run_flags()["bn_bound"]
    assert flag["broken"] is True and flag["dims"] == FLAT and flag["stage"] == "test" and flag["texts"] == 40
    assert flag["eps"] == 1e-5 and flag["threshold"] == pytest.approx(THRESHOLD * 1e-5)
    assert 0 <= flag["min_raw_var"] < 1e-8 < THRESHOLD * 1e-5 < flag["min_running_var"]  # the trained running variance
    assert f"variance down to {flag['min_raw_var']:.2g} over" in test_line
    json.dumps(model.run_flags(), allow_nan=False)  # plain JSON for metrics.json
    assert val["stage"] == "val" and val["dims"] == FLAT and val["texts"] == 40


def test_the_flag_survives_a_checkpoint_and_the_test_measurement_replaces_it(healthy, tmp_path, capsys):
    model, dm = flat_model(healthy)
    t = trainer(tmp_path)
    t.validate(model, dm)
    t.save_checkpoint(tmp_path / "broken.ckpt")
    fresh = SeqVAE.load_from_checkpoint(tmp_path / "broken.ckpt")  # as `seqvae test --ckpt_path` loads it
    assert fresh.checks["bn_bound"] == model.checks["bn_bound"] and fresh.checks["bn_bound"]["stage"] == "val"
    old = torch.load(tmp_path / "broken.ckpt", weights_only=False)  # as written before `checks` held every record
    old["seqvae"]["bn_bound"] = old["seqvae"].pop("checks")["bn_bound"]
    torch.save(old, tmp_path / "old.ckpt")
    assert SeqVAE.load_from_checkpoint(tmp_path / "old.ckpt").checks == {"bn_bound": model.checks["bn_bound"]}
    with torch.no_grad():  # now the encoder is healthy: the test's measurement is the one that counts
        fresh.encoder.to_posterior.weight[FLAT] *= 1e4
    capsys.readouterr()
    trainer(tmp_path).test(fresh, dm)
    assert warnings_in(capsys.readouterr().err) == []
    assert fresh.run_flags()["bn_bound"]["broken"] is False and fresh.run_flags()["bn_bound"]["stage"] == "test"


def test_a_running_variance_below_the_threshold_breaks_it_too(healthy, tmp_path, capsys):
    model, dm = flat_model(healthy, dims=[])
    # the new user's yelp run: a running variance below ε itself, a running mean 0.045 off the texts' mean
    model.encoder.mean_norm.running_var[2] = 5.6e-6
    model.encoder.mean_norm.running_mean[2] += 0.045
    trainer(tmp_path).test(model, dm)
    (line,) = warnings_in(capsys.readouterr().err)
    assert "in 1 of 4 latent dimensions (2) " in line and "running variance down to 5.6e-06" in line
    assert model.checks["bn_bound"]["dims"] == [2] and model.checks["bn_bound"]["min_running_var"] == pytest.approx(5.6e-6)
    shift = model.checks["bn_bound"]["max_eval_shift"]  # γ·0.045/√(5.6e-6 + 1e-5) ≈ 6.8, give or take the texts' own offset
    assert 5 < shift < 9 and f"moves the texts' mean up to {shift:.2g} prior s.d. off β;" in line


def test_a_healthy_bn_vae_does_not_warn(corpus, tmp_path, capsys):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, bn_gamma=0.6, init="pytorch")
    t = trainer(tmp_path, max_epochs=2)
    t.fit(model, dm)
    t.test(model, dm)
    assert warnings_in(capsys.readouterr().err) == []
    flag = model.run_flags()["bn_bound"]
    assert flag["broken"] is False and flag["dims"] == [] and flag["stage"] == "test"
    assert flag["min_raw_var"] > 100 * flag["threshold"] and flag["min_running_var"] > 100 * flag["threshold"]


def test_a_model_without_bn_vae_has_no_flag(corpus, tmp_path, capsys):  # noqa: F811
    root, _ = corpus
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size)
    trainer(tmp_path).test(model, dm)
    assert model.run_flags() == {} and model.checks == {}
    assert tiny_model(dm.vocab_size, latent_dim=0).run_flags() == {}


# ------------------------------------------------------------------------------------- compare
BROKEN = {"broken": True, "dims": [0, 1, 2], "min_raw_var": 2.6e-8, "eps": 1e-5, "stage": "test"}
HEALTHY = {"broken": False, "dims": [], "min_raw_var": 0.03, "eps": 1e-5, "stage": "test"}


@pytest.fixture
def bn_runs(tmp_path):
    """base: no flag (3 seeds); bn: seed 2 broke its bound; ok: every run healthy."""
    for seed in (1, 2, 3):
        m = lambda nll: metrics(nll, 60.0) | {"test/iw_nll_se": 0.1}  # noqa: E731
        make_run(tmp_path, "base", seed, m(100.0 + seed), latent_dim=8)
        make_run(tmp_path, "bn", seed, m(90.0 + seed) | {"bn_bound": BROKEN if seed == 2 else HEALTHY}, latent_dim=16)
        make_run(tmp_path, "ok", seed, m(95.0 + seed) | {"bn_bound": HEALTHY}, latent_dim=32)
    return tmp_path


NOTE = ("- † BN-VAE bound broken in runs bn (seed2): see metrics.json bn_bound; their KL, AU, MI, IW-NLL, PPL, "
        "−ELBO and μ erank are not BN-VAE's (raw means vary by less than 10·bn_eps)")  # fmt: skip


def test_compare_marks_the_runs_whose_bound_broke(bn_runs, capsys):
    rc, out, _ = run_compare(capsys, f"{bn_runs}/yahoo/*/seed*", "--label", "dir")
    assert rc == 0
    lines = out.splitlines()
    headers = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    rows = md_rows(out)
    col = {h: headers.index(h) for h in ("IW-NLL", "KL", "AU", "MI", "PPL", "IW-NLL MC se", "feature cos")}
    bn, ok = rows["bn"], rows["ok"]
    assert bn[col["KL"]] == "2.00 ± 0.00†" and bn[col["AU"]] == "4.0 ± 0.0†" and bn[col["IW-NLL"]] == "92.00 ± 1.00†"
    assert bn[col["MI"]].endswith("†") and bn[col["PPL"]].endswith("†")
    assert not bn[col["feature cos"]].endswith("†") and not bn[col["IW-NLL MC se"]].endswith("†")  # not of the means
    assert not any("†" in c for c in ok + rows["base"])  # a healthy flag and no flag read alike
    assert lines[-1] == NOTE and lines[-2] == ""
    rc, out, _ = run_compare(capsys, f"{bn_runs}/yahoo/*/seed*", "--label", "dir", "--format", "json")
    doc = json.loads(out)
    by_label = {r["label"]: r for r in doc["rows"]}
    assert by_label["bn"]["unreliable"] == ["iw_nll", "neg_elbo", "kl", "mi", "mi_dataset", "au", "mu_erank", "iw_ppl"]
    assert "unreliable" not in by_label["ok"] and "unreliable" not in by_label["base"]
    assert [r.get("bn_bound") for r in by_label["bn"]["runs"]] == [HEALTHY, BROKEN, HEALTHY]
    assert all("bn_bound" not in r for r in by_label["base"]["runs"])
    assert NOTE[2:] in doc["warnings"]


def test_compare_marks_differences_that_involve_such_a_run(bn_runs, capsys):
    rc, out, _ = run_compare(capsys, f"{bn_runs}/yahoo/*/seed*", "--label", "dir", "--baseline", f"{bn_runs}/yahoo/base/seed*")
    assert rc == 0
    rows = md_rows(out)
    headers = [c.strip() for c in next(x for x in out.splitlines() if x.startswith("| run ")).strip("|").split("|")][1:]
    kl, au, nll = headers.index("KL"), headers.index("AU"), headers.index("IW-NLL")
    assert rows["bn"][kl].endswith("†") and rows["bn"][au].endswith("†") and rows["bn"][nll] == "-10.00 on every seed (3/3)†"
    assert not any("†" in c for c in rows["ok"] + rows["base (baseline)"])
    assert out.splitlines()[-1] == NOTE
    rc, out, _ = run_compare(capsys, f"{bn_runs}/yahoo/*/seed*", "--label", "dir", "--baseline", f"{bn_runs}/yahoo/base/seed*",
                             "--format", "json")  # fmt: skip
    by_label = {r["label"]: r for r in json.loads(out)["rows"]}
    of_the_means = set(compare.BN_UNRELIABLE) & set(compare.DIFF_METRICS)
    assert all(by_label["bn"]["difference"][mid]["unreliable"] is True for mid in of_the_means)
    assert all("unreliable" not in d for d in by_label["ok"]["difference"].values())
    # the baseline itself broken: every difference to it is marked, and its own row too
    rc, out, _ = run_compare(capsys, f"{bn_runs}/yahoo/*/seed*", "--label", "dir", "--baseline", f"{bn_runs}/yahoo/bn/seed*")
    rows = md_rows(out)
    assert rows["ok"][kl].endswith("†") and rows["base"][au].endswith("†") and rows["bn (baseline)"][kl].endswith("†")


def test_compares_footnote_for_records_written_before_they_had_titles_is_the_checks_own():
    from seqvae.analysis.runs import UNTITLED
    from seqvae.core.bn_bound import CONSEQUENCE, TITLE

    assert UNTITLED["bn_bound"] == (TITLE, CONSEQUENCE)  # an old record's footnote reads as a new one's
