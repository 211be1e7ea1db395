"""The fused output layer + cross-entropy (`seqvae.fused_ce`) against the plain logits path.

Tolerance: the fused path sums in another order (per chunk, one-pass gradients scaled afterwards),
so values agree to the issue's 1e-5 relative, not bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqvae.core import fused_ce
from seqvae.core.fused_ce import linear_cross_entropy
from seqvae.core.model import SeqVAE

N, H, V, S = 60, 16, 37, 6  # S sequences of N / S tokens
TOL = dict(rtol=1e-5, atol=1e-6)


def inputs(seed=0, n=N, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, H, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(V, H, generator=g, dtype=dtype).requires_grad_()
    bias = torch.randn(S, V, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(0, V, (n,), generator=g)
    index = torch.arange(S).repeat_interleave(n // S)  # bias row of each row: its sequence
    return h, w, bias, targets, index


def plain(h, w, targets, bias=None, index=None):
    logits = h @ w.T + (bias[index] if bias is not None else 0)
    return F.cross_entropy(logits.float(), targets, reduction="none")


def grads(loss, *tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 60, 256, None])  # 7 does not divide N; N < 256 rows: one chunk
@pytest.mark.parametrize("weighting", ["mean", "random"])  # one-pass gradients / recomputed in backward
def test_values_and_gradients_equal_cross_entropy_of_plain_logits(with_bias, rows, weighting):
    h, w, bias, targets, index = inputs()
    bias, index = (bias, index) if with_bias else (None, None)
    weights = torch.full((N,), 1 / N) if weighting == "mean" else torch.randn(N, generator=torch.Generator().manual_seed(1))
    fused = linear_cross_entropy(h, w, targets, bias, index, rows)
    expected = plain(h, w, targets, bias, index)
    torch.testing.assert_close(fused, expected, **TOL)
    got = grads((fused * weights).sum(), h, w, bias)
    want = grads((expected * weights).sum(), h, w, bias)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_gradcheck_fp64():
    h, w, bias, targets, index = inputs(n=12, dtype=torch.float64)
    fn = lambda h, w, b: linear_cross_entropy(h, w, targets, b, index[:12] // 2, rows=5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, w, bias))  # random incoming gradients: the recomputing backward
    assert torch.autograd.gradcheck(lambda *a: fn(*a).sum(), (h, w, bias))  # uniform: the one-pass gradients


def test_only_the_inputs_that_need_a_gradient_get_one():
    h, w, bias, targets, index = inputs()
    w.requires_grad_(False)  # the frozen decoder of an aggressive encoder step
    fused = linear_cross_entropy(h, w, targets, bias, index, rows=7)
    expected = plain(h, w, targets, bias, index)
    for a, b in zip(grads(fused.mean(), h, bias), grads(expected.mean(), h, bias)):
        torch.testing.assert_close(a, b, **TOL)


def test_backward_twice_with_retain_graph():
    h, w, bias, targets, index = inputs()
    loss = 3 * linear_cross_entropy(h, w, targets, bias, index, rows=7).sum()  # scale 3: in-place scaling would show
    first = torch.autograd.grad(loss, [h, w], retain_graph=True)
    loss.backward(retain_graph=True)
    loss.backward()
    torch.testing.assert_close(w.grad, 2 * first[1], **TOL)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_without_grad_mode_nothing_is_kept_for_a_backward(mode, monkeypatch):
    h, w, bias, targets, index = inputs()
    expected = linear_cross_entropy(h, w, targets, bias, index, rows=7).detach()
    calls = []
    original = fused_ce._softmax_grads
    monkeypatch.setattr(fused_ce, "_softmax_grads", lambda *a, **k: calls.append(a[7:] + tuple(k)) or original(*a, **k))
    with mode():
        got = linear_cross_entropy(h, w, targets, bias, index, rows=7)
    assert got.grad_fn is None and not got.requires_grad
    assert calls == [()]  # one forward pass, no gradient buffers
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_evaluation_takes_larger_chunks_than_training(monkeypatch):
    """At V = 20k a training chunk holds 256 rows (2**22 logits would be 209), an evaluation chunk
    800 (issue 37: faster there); at V = 5k both hold 838 (2**22 logits: larger cost memory)."""
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(900, 4, generator=g).requires_grad_(), torch.randn(20000, 4, generator=g)
    targets = torch.randint(0, 20000, (900,), generator=g)
    rows = []
    original = fused_ce._softmax_grads
    monkeypatch.setattr(fused_ce, "_softmax_grads", lambda *a, **k: rows.append(a[5]) or original(*a, **k))
    trained = linear_cross_entropy(h, w, targets)
    with torch.no_grad():
        evaluated = linear_cross_entropy(h, w, targets)
    assert rows == [256, 800]
    torch.testing.assert_close(evaluated, trained.detach(), **TOL)
    assert (fused_ce.chunk_rows(5000), fused_ce.chunk_rows(5000, min_rows=fused_ce.EVAL_MIN_ROWS)) == (838, 838)


def test_bf16_autocast_is_close_to_fp32():
    h, w, bias, targets, index = inputs()
    expected = plain(h, w, targets, bias, index)
    want = grads(expected.mean(), h, w, bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_cross_entropy(h, w, targets, bias.bfloat16(), index, rows=7)
    assert fused.dtype == torch.float32  # the log-sum-exp and the NLL stay fp32
    # bf16 GEMM inputs (8 bits of mantissa) on logits of |x| ~ 4: errors ~ 0.02 per logit
    torch.testing.assert_close(fused, expected, rtol=0.02, atol=0.05)
    for a, b in zip(grads(fused.mean(), h, w, bias), want):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=0.05, atol=2e-3)


def test_a_bias_needs_its_index():
    h, w, bias, targets, _ = inputs()
    with pytest.raises(ValueError, match="bias_index"):
        linear_cross_entropy(h, w, targets, bias)


# ---------------------------------------------------------------- the model's switch
def tiny(fused, **kw):
    torch.manual_seed(0)
    model = SeqVAE(23, **{"embed_dim": 8, "hidden_dim": 12, "latent_dim": 4, "fused_output": fused, **kw})
    for p in model.parameters():  # larger than the reference init, so the logits differ by row
        torch.nn.init.uniform_(p, -0.5, 0.5)
    return model


def padded_batch():
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([7, 3, 5, 2, 7])
    tokens = torch.randint(4, 23, (5, 7), generator=g)
    tokens[:, 0] = 1
    tokens[torch.arange(5), lengths - 1] = 2
    return {"tokens": tokens, "lengths": lengths}


@pytest.mark.parametrize("kw", [{}, {"skip": True}, {"latent_dim": 0}, {"word_dropout": 0.3}])
def test_model_switch_gives_the_same_loss_and_gradients(kw):
    """Training mode (dropout on), a padded batch: the same loss and gradients both ways."""
    assert SeqVAE(23, fused_output=False).decoder.fused_output is False and SeqVAE(23).decoder.fused_output
    out = {}
    for fused in (True, False):
        model = tiny(fused, **kw).train()
        torch.manual_seed(1)  # the same dropout masks and z
        loss = model.loss_terms(padded_batch(), kl_weight=0.5)["loss"]
        loss.backward()
        out[fused] = loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(out[True][0], out[False][0], **TOL)
    assert out[True][1].keys() == out[False][1].keys()
    for name, g in out[True][1].items():
        torch.testing.assert_close(g, out[False][1][name], rtol=1e-5, atol=1e-5, msg=name)


def test_model_log_likelihood_of_several_samples_agrees_under_inference_mode():
    batch = padded_batch()
    z = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(4))
    got = {}
    for fused in (True, False):
        model = tiny(fused, skip=True).eval()
        with torch.inference_mode():
            got[fused] = model.decoder.log_likelihood(batch["tokens"], batch["lengths"], z)
    torch.testing.assert_close(got[True], got[False], **TOL)


def test_training_on_a_padded_batch_takes_the_one_pass_gradients(monkeypatch):
    """Padding is left out, so every NLL the loss sums has the same gradient: no recomputing backward."""
    calls = []
    original = fused_ce._softmax_grads
    monkeypatch.setattr(fused_ce, "_softmax_grads", lambda *a, **k: calls.append(len(a) > 8) or original(*a, **k))
    model = tiny(True, skip=True).train()
    model.loss_terms(padded_batch(), kl_weight=1.0)["loss"].backward()
    assert calls == [False]  # one call, in forward, with unit row weights
