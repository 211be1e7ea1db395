"""SA-VAE held to He et al.'s own code (jxhe/vae-lagging-encoder, branch sa-vae: OptimN2N, text_sa.py's
training step and nll_iw) on the same weights, batch and noise (issue 49). The fixture holds the seeds and
the reference's numbers only, written by `python -m tools.reference pin-sa --he DIR` (commit in its
`provenance`); seqvae's side is rebuilt here from the same seeds (`tools/reference/pin_savae.py`; the cases are
described there, the figures in docs/sa_vae.md)."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from tools.reference import pin_savae

FIXTURE = json.loads(pin_savae.FIXTURE.read_text())
BATCHES = json.loads(pin_savae.BATCHES.read_text())
V = BATCHES["vocab_size"]
# float64 forward: the same operations in the same order (0 measured); float32: rounding of the clipped steps
FORWARD_REL = {"float64": 1e-10, "float32": 1e-5}


def close(ref, ours, rel: float) -> None:
    wide = lambda x: x.double() if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)  # noqa: E731 (floats: never via fp32)
    ref, ours = wide(ref), wide(ours)
    scale = max(float(ref.abs().max()), 1e-30)
    assert float((ref - ours).abs().max()) <= rel * scale, float((ref - ours).abs().max()) / scale


@functools.cache
def step(name: str) -> dict:
    """seqvae's training step of case `name` (once per session: the tests below share it)."""
    case = FIXTURE["cases"][name]
    return pin_savae.train_step(pin_savae.model(V, case), BATCHES["train"][case["train_batch"]], case["kl_weight"])


@pytest.fixture(params=["exact", "clipped"])
def trained(request):
    return request.param, FIXTURE["cases"][request.param], step(request.param)


def test_refined_posteriors_after_every_svi_step_and_the_losses(trained):
    name, case, ours = trained
    ref, rel = case["reference"], FORWARD_REL[case["dtype"]]
    assert len(ours["params"]) == len(ref["params"]) == case["steps"]
    for (mu, logvar), (r_mu, r_logvar) in zip(ours["params"], ref["params"]):
        close(r_mu, mu, rel), close(r_logvar, logvar, rel)
    close(ref["inner_losses"], ours["inner_losses"], rel)
    for key in ("loss", "rec", "kl"):
        close(ref[key], ours[key], rel)


def test_end_to_end_gradients_equal_the_references_where_its_clipping_does_not_bind():
    """float64, every norm in the reference's backward below 5: its finite differences (r = 1e-5) are the exact
    meta-gradient to ~1e-7 relative, and seqvae's double backward agrees (5.6e-10 encoder, 3.9e-8 decoder measured)."""
    case = FIXTURE["cases"]["exact"]
    ref = case["reference"]
    assert max(ref["clip_norms_backward"]) < case["clip"]  # the case's premise
    grads = pin_savae.comparable_grads(step("exact")["grads"], V)
    digest = pin_savae.pin_seqvae.digest(grads)
    for name, d in ref["grads"].items():
        scale = math.sqrt(d["sumsq"])
        assert abs(math.sqrt(digest[name]["sumsq"]) - scale) <= 1e-6 * scale, name
        assert digest[name]["index"] == d["index"]
        worst = max(abs(a - b) for a, b in zip(digest[name]["values"], d["values"]))
        assert worst <= 1e-6 * scale, (name, worst)
        for key in ("sum", "proj"):
            assert abs(digest[name][key] - d[key]) <= 1e-6 * scale * math.sqrt(d["numel"]), (name, key)


def side_norms(grads: dict) -> dict:
    return {s: math.sqrt(sum(float(g.double().pow(2).sum()) for k, g in grads.items() if k.startswith(s))) for s in ("encoder", "decoder")}


def test_the_references_clipping_mix_measured_where_it_binds():
    """float32, the decoder's output layer x 4: norms up to ~6e5 reach the reference's backward clip (SPEC §13.6).
    The forward path still agrees (test above); the reference's gradient is 17.2x seqvae's exact one on the
    encoder and 8.3x on the decoder (docs/sa_vae.md). seqvae keeps the exact gradient on purpose."""
    case = FIXTURE["cases"]["clipped"]
    ref = case["reference"]
    assert max(ref["clip_norms_backward"]) > 1e5
    ours = side_norms(pin_savae.comparable_grads(step("clipped")["grads"], V))
    theirs = {s: math.sqrt(sum(d["sumsq"] for k, d in ref["grads"].items() if k.startswith(s))) for s in ("encoder", "decoder")}
    assert theirs["encoder"] / ours["encoder"] == pytest.approx(17.24, rel=0.01)
    assert theirs["decoder"] / ours["decoder"] == pytest.approx(8.27, rel=0.01)


def test_refined_posteriors_and_iw_nll_with_refinement_at_evaluation():
    case = FIXTURE["cases"]["eval"]
    m = pin_savae.model(V, case)
    ours = pin_savae.evaluate(m, [BATCHES["test"][i] for i in case["test_batches"]])
    for (mu, logvar), (r_mu, r_logvar) in zip(ours["refined"], case["reference"]["refined"]):
        close(r_mu, mu, 1e-10), close(r_logvar, logvar, 1e-10)
    for nll, r_nll in zip(ours["iw_nll"], case["reference"]["iw_nll"]):
        close(r_nll, nll, 1e-12)


def test_the_fixture_names_the_reference_commit():
    he = FIXTURE["provenance"]["references"]["he"]
    assert he["branch"] == "sa-vae" and len(he["commit"]) == 40
