"""Evaluation's output path, A/B in one process (issue 37, item 1): IW-NLL of documents through the
fused output layer (`seqvae test`'s path) and through the plain logits, each with IW decoder calls of
2**26 logits (the CPU default, `iw_max_elements`) and of 2**24, alternated `--rounds` times so that a
load that drifts hits every variant alike. `--chunks 24,26` adds fused variants whose chunks (logits
per `fused_ce` chunk, default 2**22, at least `EVAL_MIN_ROWS` rows without gradients since issue 37)
are 2**24 and 2**26 elements instead, at least 256 rows (`--chunks 22`: the default before issue 37).

    python scripts/bench_eval_path.py [--config small|paper] [--k 500] [--docs 1] [--length 81] [--rounds 7] [--threads 1]
        [--chunks 24,26]

Prints the median seconds per document of each variant, each relative to `fused 2^26` (seqvae's
default), and the 1-minute load average before and after. Random ids (the speed does not depend on
the words); the IW-NLL sums are printed so the variants can be seen to agree. Memory is not measured
here: `scripts/bench_memory.py` (with `--extra "--model.fused_output false"` for the plain path).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from seqvae.core import fused_ce
from seqvae.core.metrics import iw_nll
from seqvae.core.model import SeqVAE
from seqvae.training.allocator import reuse_freed_memory

CONFIGS = {"small": dict(embed_dim=64, hidden_dim=128, latent_dim=32, vocab_size=5000),
           "paper": dict(embed_dim=512, hidden_dim=1024, latent_dim=32, vocab_size=20000)}  # fmt: skip
VARIANTS = {"fused 2^26": (True, 2**26, None), "plain 2^26": (False, 2**26, None), "fused 2^24": (True, 2**24, None),
            "plain 2^24": (False, 2**24, None)}  # name: (fused_output, iw_max_elements, fused chunk elements or the default)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small", choices=list(CONFIGS))
    p.add_argument("--k", type=int, default=500)
    p.add_argument("--docs", type=int, default=1)
    p.add_argument("--length", type=int, default=81, help="tokens per document, <s> and </s> included (Yahoo's mean: 81)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--chunks", default="", help="comma-separated log2 sizes of extra fused chunk variants, e.g. 24,26")
    a = p.parse_args()
    variants = dict(VARIANTS)
    for bits in filter(None, a.chunks.split(",")):
        variants[f"fused 2^26, chunks 2^{int(bits)}"] = (True, 2**26, 2 ** int(bits))
    default_rows = fused_ce.chunk_rows
    reuse_freed_memory()  # as the seqvae command does
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = CONFIGS[a.config]
    model = SeqVAE(**cfg).eval()
    tokens = torch.randint(4, cfg["vocab_size"], (a.docs, a.length))
    lengths = torch.full((a.docs,), a.length)

    def one(fused: bool, budget: int, chunk: int | None) -> tuple[float, float]:
        model.decoder.fused_output, model.hparams.iw_max_elements = fused, budget
        fused_ce.chunk_rows = default_rows if chunk is None else lambda v, elements=None, min_rows=None: default_rows(v, chunk)
        g = torch.Generator().manual_seed(1)
        start = time.perf_counter()
        with torch.no_grad():
            mu, logvar, _ = model.encoder(tokens, lengths)
            ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
            value = float(iw_nll(ll, mu, logvar, a.k, model.iw_chunk(tokens), g).sum())
        return (time.perf_counter() - start) / a.docs, value

    load0 = os.getloadavg()[0]
    values = {name: one(*v)[1] for name, v in variants.items()}  # warm-up
    times = {name: [] for name in variants}
    for r in range(a.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            times[name].append(one(*variants[name])[0])
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med["fused 2^26"]
    print(f"{a.config}, K {a.k}, {a.docs} doc(s) of {a.length} tokens, {a.threads} thread(s), {a.rounds} rounds, "
          f"1-min load {load0:.2f} -> {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name in variants:
        print(f"  {name}: {med[name]:.3f} s/doc ({base / med[name]:.2f}x the fused 2^26 speed), IW-NLL sum {values[name]:.4f}")


if __name__ == "__main__":
    main()
