"""The output layer and cross-entropy fused: per-token NLL of `h @ W.T (+ bias)` without the N×V logits.

The plain path writes N×V logits, a log-softmax copy of them, and in training a zeroed and filled
N×V gradient (at 32 × 80 tokens and V = 16k, ~166 MB each). Here the rows are processed in chunks
whose logits stay within `CHUNK_ELEMENTS`: the forward keeps only each row's log-sum-exp (N floats),
and the backward recomputes a chunk's logits from h and W (one extra GEMM) to form its softmax
gradient and adds its share to dL/dh, dL/dW and dL/dbias at once. In the spirit of the fused
linear-cross-entropy kernels of LLM training (Liger, Cut Cross-Entropy), in plain PyTorch ops, so
it runs on any device.

Values: logits, log-sum-exp and softmax are fp32, as the plain path's `logits.float()`; under
autocast the GEMMs run in the autocast dtype (bf16), as `nn.Linear` would.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2**21  # logits per chunk: 8 MiB of fp32, cache-sized, yet ≥ 100 rows for GEMM efficiency at V = 20k


def chunk_rows(vocab_size: int, elements: int = CHUNK_ELEMENTS) -> int:
    return max(1, elements // vocab_size)


def _compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype autocast would give the output layer's GEMM (autocast is off inside our ops)."""
    if torch.is_autocast_enabled(t.device.type):
        return torch.get_autocast_dtype(t.device.type)
    return t.dtype


def _wide(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32, bf16 and fp16; fp64 stays fp64 (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(h, weight, bias, start, stop, rows_per_bias):
    """fp32 logits (C, V) of rows start:stop; bias row i serves rows i·R … (i+1)·R − 1."""
    logits = h[start:stop] @ weight.T
    logits = logits.to(_wide(logits.dtype))
    if bias is not None:
        rows = torch.arange(start, stop, device=h.device) // rows_per_bias
        logits += bias.index_select(0, rows)
    return logits


def _forward(h, weight, bias, targets, rows, dtype):
    """Per-row NLL and log-sum-exp (both (N,), fp32), chunk by chunk."""
    h, weight = h.to(dtype), weight.to(dtype)  # no-ops unless autocast asks for another dtype
    n = h.size(0)
    rows_per_bias = n // bias.size(0) if bias is not None else 1
    lse = torch.empty(n, dtype=_wide(h.dtype), device=h.device)
    target_logit = torch.empty_like(lse)
    for start in range(0, n, rows):
        stop = min(start + rows, n)
        logits = _chunk_logits(h, weight, bias, start, stop, rows_per_bias)
        target_logit[start:stop] = logits.gather(1, targets[start:stop, None]).squeeze(1)
        m = logits.amax(1, keepdim=True)
        lse[start:stop] = logits.sub_(m).exp_().sum(1).log_().add_(m.squeeze(1))  # in place: no second C×V buffer
    return lse - target_logit, lse


class LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, targets, rows):
        dtype = _compute_dtype(h)
        with torch.autocast(h.device.type, enabled=False):  # the casts are explicit, in forward and backward alike
            nll, lse = _forward(h, weight, bias, targets, rows, dtype)
        ctx.save_for_backward(h, weight, bias, targets, lse)
        ctx.rows, ctx.dtype = rows, dtype
        return nll

    @staticmethod
    def backward(ctx, grad_nll):
        h, weight, bias, targets, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]  # a frozen W (aggressive encoder step): no dW GEMM
        n, rows = h.size(0), ctx.rows
        rows_per_bias = n // bias.size(0) if bias is not None else 1
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=lse.dtype) if need_w else None  # fp32 sums over the chunks
        grad_b = torch.zeros_like(bias, dtype=lse.dtype) if need_b else None
        grad_nll = grad_nll.to(lse.dtype)
        with torch.autocast(h.device.type, enabled=False):  # if backward runs under autocast: our dtypes still
            hc, wc = h.to(ctx.dtype), weight.to(ctx.dtype)
            for start in range(0, n, rows):
                stop = min(start + rows, n)
                # d nll / d logits = softmax − onehot(target), times the incoming gradient of the row
                g = _chunk_logits(hc, wc, bias, start, stop, rows_per_bias).sub_(lse[start:stop, None]).exp_()
                g[torch.arange(stop - start, device=g.device), targets[start:stop]] -= 1
                g *= grad_nll[start:stop, None]
                if need_b:
                    grad_b.index_add_(0, torch.arange(start, stop, device=g.device) // rows_per_bias, g)
                g = g.to(ctx.dtype)  # the GEMMs in autocast's dtype, as nn.Linear's backward
                if need_h:
                    grad_h[start:stop] = g @ wc
                if need_w and g.dtype == grad_w.dtype:
                    grad_w.addmm_(g.T, hc[start:stop])
                elif need_w:
                    grad_w += g.T @ hc[start:stop]
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, bias: torch.Tensor | None = None, rows: int | None = None
) -> torch.Tensor:
    """Per-row NLL (N,), fp32, of softmax(h @ weight.T + bias) at `targets`, as
    `F.cross_entropy(logits.float(), targets, reduction="none")`.

    h (N, H) states; weight (V, H); targets (N,) ids; bias (S, V) or None with N divisible by S:
    bias row i is added to rows i·N/S … (i+1)·N/S − 1 (SkipVAE's z term: one row per sequence,
    broadcast over its time steps). `rows`: rows per chunk (default: `CHUNK_ELEMENTS` logits).
    Without grad mode (evaluation, IW-NLL under inference mode) nothing is kept for a backward."""
    if bias is not None and h.size(0) % bias.size(0):
        raise ValueError(f"h has {h.size(0)} rows, not a multiple of the bias's {bias.size(0)}")
    rows = rows or chunk_rows(weight.size(0))
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, weight, bias)):
        return LinearCrossEntropy.apply(h, weight, bias, targets, rows)
    dtype = _compute_dtype(h)
    with torch.autocast(h.device.type, enabled=False):
        return _forward(h, weight, bias, targets, rows, dtype)[0]
