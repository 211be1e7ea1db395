"""The "peak" of benchmarks/bench.py: the best GEMM rate of several shapes measured in the same run.

A single square 2048³ GEMM was no upper bound: paper-size training and IW-NLL ran at 104.6% and
108.2% of it (issue 37), since MKL/oneDNN run some shapes faster than that one. So the peak is the
best of the square 2048³ and 4096³ GEMMs and of each config's own GEMMs (rows × k by k × n):

- output layer, training: the batch's B·(T−1) predicted tokens × H by H × V, and the fused path's
  chunk of `fused_ce.chunk_rows(V)` rows;
- output layer, IW-NLL: the rows of one IW decoder call (n_docs · samples per call · (T−1), the
  plain path's one GEMM) and the fused path's forward-only chunk of
  `chunk_rows(V, min_rows=EVAL_MIN_ROWS)` rows (when smaller);
- decoder LSTM step: B × (E+Z+H) by (E+Z+H) × 4H (input [emb; z] and h against the four gates'
  weights), for the training batch and for one IW decoder call's B·samples sequences.

T is the Yahoo mean length (81 tokens incl. `<s> </s>`, which bench.py's batches are closest to).
A rate above the peak is reported as such (`rate_against_peak`), never as a fraction over 100%.
"""

from __future__ import annotations

import math
import time

import torch

from seqvae.core.evaluation import iw_chunk
from seqvae.core.fused_ce import EVAL_MIN_ROWS, chunk_rows

MEAN_T = 81  # Yahoo valid.txt: 81.1 tokens per text incl. <s> </s>


def clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def gemm_gflops(m, k, n, dtype, device, reps) -> float:
    """Best of `reps` timed (m, k) x (k, n) products, after one untimed."""
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
    c, best = torch.mm(a, b), math.inf  # the first product is the warm-up
    for _ in range(reps):
        t = clock(device)
        torch.mm(a, b, out=c)
        best = min(best, clock(device) - t)
    return 2 * m * k * n / best / 1e9


def peak_shapes(configs: dict, batch: int, iw_docs: dict, device, t: int = MEAN_T) -> dict[str, tuple[int, int, int]]:
    """Name -> (m, k, n) of every GEMM the peak is the best of. `configs`: name -> embed_dim,
    hidden_dim, latent_dim, vocab_size; `iw_docs`: name -> documents per IW-NLL call (whose
    samples per call `iw_chunk` sizes as bench.py's IW-NLL does, on `device`)."""
    shapes = {"square 2048^3": (2048, 2048, 2048), "square 4096^3": (4096, 4096, 4096)}
    for name, cfg in configs.items():
        E, H, Z, V = cfg["embed_dim"], cfg["hidden_dim"], cfg["latent_dim"], cfg["vocab_size"]
        samples = iw_docs[name] * iw_chunk(torch.empty(iw_docs[name], t, device=device), V, None)  # sequences per IW decoder call
        rows = {
            "output layer, training batch": batch * (t - 1),
            "output layer, fused training chunk": chunk_rows(V),
            "output layer, IW call": samples * (t - 1),
            "output layer, fused IW chunk": min(samples * (t - 1), chunk_rows(V, min_rows=EVAL_MIN_ROWS)),
        }
        for what, m in rows.items():
            shapes[f"{name} {what}"] = (m, H, V)
        shapes[f"{name} LSTM step, training batch"] = (batch, E + Z + H, 4 * H)
        shapes[f"{name} LSTM step, IW call"] = (samples, E + Z + H, 4 * H)
    return shapes


def measure_peak(shapes: dict, dtype, device, report=print) -> dict:
    """GFLOP/s of every shape in `dtype`; the best is the peak. Returns {"gflops": {name: rate},
    "peak_gflops", "peak_shape"}; prints one line per shape and one for the peak through `report`."""
    kind = str(dtype).split(".")[1]
    rates = {}
    for name, (m, k, n) in shapes.items():
        rates[name] = gemm_gflops(m, k, n, dtype, device, 3 if m * n > 2**22 else 10)
        report(f"GEMM {kind} {name:<42} {m:>6}x{k}x{n:<6} {rates[name]:8.1f} GFLOP/s")
    best = max(rates, key=rates.get)
    report(f"peak ({kind}): {rates[best]:.1f} GFLOP/s, the best of {len(rates)} shapes, set by {best} {tuple(shapes[best])}")
    return {"gflops": rates, "peak_gflops": rates[best], "peak_shape": best, "peak_mkn": list(shapes[best])}


def rate_against_peak(gflops: float, peak: float) -> tuple[dict, str]:
    """The JSON fields and the printed text of an achieved rate against the peak: a fraction up
    to 100%; above the peak no fraction at all (it would claim more than the machine's best GEMM)
    but how far above, in words and in `above_peak_by`."""
    if gflops <= peak:
        return {"fraction_of_peak": gflops / peak}, f"{gflops / peak:5.1%} of peak"
    over = gflops / peak - 1
    return {"fraction_of_peak": None, "above_peak_by": over}, f"ABOVE the measured peak by {over:.1%} (no fraction)"
