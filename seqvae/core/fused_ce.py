"""The output layer and cross-entropy fused: per-token NLL of `h @ W.T (+ bias)` without the N×V logits.

The plain path writes N×V logits, a log-softmax copy of them, and in training a zeroed and filled
N×V gradient (at 32 × 80 tokens and V = 16k, ~166 MB each). Here the rows are processed in chunks
whose logits stay within `CHUNK_ELEMENTS`; a chunk holds whole rows, so its log-softmax is final
and, when gradients are needed, its softmax gradient is formed right away and added to dL/dh,
dL/dW and dL/dbias in the same pass (as Liger's fused linear-cross-entropy does for LLMs): the
backward then only scales them. That is exact when the incoming gradient is the same for every row
(a sum or mean of the NLLs: every training loss of seqvae, which passes real tokens only). For any
other incoming gradient the backward recomputes each chunk's logits (one more GEMM) instead.
Plain PyTorch ops: it runs on any device.

Values: logits, log-softmax and softmax are fp32, as the plain path's `logits.float()`; under
autocast the GEMMs run in the autocast dtype (bf16), as `nn.Linear`'s would.
"""

from __future__ import annotations

import torch

# Logits per chunk: 16 MiB of fp32 (the plain path's are 50-200 MB). At least 256 rows: a GEMM
# repacks all of W per chunk, and at V = 20k fewer rows cost more in packing than they compute.
# Without gradients (evaluation) at least 800 rows: at V = 20k, 256-row chunks made IW-NLL 6%
# (one thread) / 12% (two) slower than 838-row ones, while at V = 5k larger chunks bought no speed
# and cost peak RSS in `seqvae test` (2**24 logits: +0.4 GB; 1024 rows: +0.14 GB; issue 37,
# docs/performance.md). So only the floor rises, and below V = 5,243 nothing changes.
CHUNK_ELEMENTS, MIN_ROWS, EVAL_MIN_ROWS = 2**22, 256, 800


def chunk_rows(vocab_size: int, elements: int = CHUNK_ELEMENTS, min_rows: int = MIN_ROWS) -> int:
    return max(min_rows, elements // vocab_size)


def _wide(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32, bf16 and fp16; fp64 stays fp64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype autocast gives the output layer's GEMM (autocast is off inside our functions)."""
    return torch.get_autocast_dtype(t.device.type) if torch.is_autocast_enabled(t.device.type) else t.dtype


def _softmax_grads(h, weight, bias, bias_index, targets, rows, dtype, grads=None, scale=None):
    """Per-row NLL (N,), chunk by chunk. With `grads` (dh, dW, db; None for those not needed)
    also adds each chunk's d NLL / d (h, W, bias), each row's times `scale` (or 1)."""
    h, weight = h.to(dtype), weight.to(dtype)  # no-ops unless autocast asks for bf16
    n = h.size(0)
    nll = torch.empty(n, dtype=_wide(dtype), device=h.device)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        logits = h[start:stop] @ weight.T
        logits = logits.to(_wide(logits.dtype))  # (C, V)
        if bias is not None:
            logits += bias.index_select(0, bias_index[start:stop])
        # log_softmax: one fused kernel, as the plain path's cross-entropy (max, sum of exps, write)
        logp = torch.log_softmax(logits, 1)
        del logits
        picked = torch.arange(stop - start, device=h.device), targets[start:stop]
        nll[start:stop] = -logp[picked]
        if grads is None:
            continue
        # d nll / d logits = softmax − onehot(target)
        g = logp.exp_()
        g[picked] -= 1
        if scale is not None:
            g *= scale[start:stop, None]
        dh, dw, db = grads
        if db is not None:
            db.index_add_(0, bias_index[start:stop], g)
        g = g.to(dtype)  # the GEMMs in autocast's dtype, as nn.Linear's backward
        if dh is not None:
            dh[start:stop] = g @ weight
        if dw is not None and dw.dtype == g.dtype:
            dw.addmm_(g.T, h[start:stop])
        elif dw is not None:
            dw += g.T @ h[start:stop]  # bf16 products, summed over the chunks in fp32
    return nll


def _empty_grads(needs, h, weight, bias):
    """dh, dW, dbias buffers (None where not needed); dW and dbias sum over chunks in fp32."""
    acc = _wide(h.dtype)
    return (
        torch.empty_like(h) if needs[0] else None,
        torch.zeros_like(weight, dtype=acc) if needs[1] else None,
        torch.zeros_like(bias, dtype=acc) if needs[2] else None,
    )


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, bias_index, targets, rows, row_weight, uniform_grad):
        ctx.dtype, ctx.rows, ctx.uniform_grad = _compute_dtype(h), rows, uniform_grad
        grads = _empty_grads(ctx.needs_input_grad, h, weight, bias)
        with torch.autocast(h.device.type, enabled=False):  # the casts are explicit, here and in backward
            nll = _softmax_grads(h, weight, bias, bias_index, targets, rows, ctx.dtype, grads, scale=row_weight)
        ctx.save_for_backward(h, weight, bias, bias_index, targets, row_weight, *grads)
        return nll if row_weight is None else nll * row_weight

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_nll):
        h, weight, bias, bias_index, targets, row_weight, dh, dw, db = ctx.saved_tensors
        c = grad_nll[:1]
        # A sum or mean of the NLLs: scale what forward computed. The caller's promise
        # (`uniform_grad`) spares the test, which reads a value back to the host (a GPU sync).
        if ctx.uniform_grad or bool((grad_nll == c).all()):
            grads = [None if g is None else g * c.to(g.dtype) for g in (dh, dw, db)]  # not in place: retain_graph
        else:  # rows weighted differently: recompute the chunks with the weights
            grads = _empty_grads(ctx.needs_input_grad, h, weight, bias)
            with torch.autocast(h.device.type, enabled=False):
                scale = grad_nll.to(_wide(h.dtype)) * (1 if row_weight is None else row_weight)
                _softmax_grads(h, weight, bias, bias_index, targets, ctx.rows, ctx.dtype, grads, scale)
        dh, dw, db = grads
        dw, db = None if dw is None else dw.to(weight.dtype), None if db is None else db.to(bias.dtype)
        return dh, dw, db, None, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    bias: torch.Tensor | None = None,
    bias_index: torch.Tensor | None = None,
    rows: int | None = None,
    row_weight: torch.Tensor | None = None,
    uniform_grad: bool = False,
) -> torch.Tensor:
    """Per-row NLL (N,), fp32, of softmax(h @ weight.T + bias[bias_index]) at `targets`, as
    `F.cross_entropy(logits.float(), targets, reduction="none")` of the plain logits.

    h (N, H) states; weight (V, H); targets (N,) ids; bias (S, V) or None, e.g. SkipVAE's z term
    (one row per sequence); bias_index (N,) the bias row of each row of h. `rows`: rows per chunk
    (default `chunk_rows(V)`, without gradients `chunk_rows(V, min_rows=EVAL_MIN_ROWS)`). Without grad
    mode (evaluation, IW-NLL under inference mode) no gradient is computed and nothing is kept for a
    backward. `row_weight` (N,) fp32: each row's NLL and gradient times it (0: padding left in, at
    no host sync); `uniform_grad`: the caller promises the incoming gradient is the same for every
    row (its loss is a sum or mean of these NLLs), so the backward does not test it."""
    if bias is not None and bias_index is None:
        raise ValueError("a bias needs its bias_index (the bias row of each row of h)")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias)):
        rows = rows or chunk_rows(weight.size(0))
        return LinearCrossEntropy.apply(h, weight, bias, bias_index, targets, rows, row_weight, uniform_grad)
    rows = rows or chunk_rows(weight.size(0), min_rows=EVAL_MIN_ROWS)
    dtype = _compute_dtype(h)
    with torch.autocast(h.device.type, enabled=False):
        nll = _softmax_grads(h, weight, bias, bias_index, targets, rows, dtype)
    return nll if row_weight is None else nll * row_weight
