"""An aggressive inner step's cost with the decoder frozen (issue 37, item 3), A/B in one process:
oneDNN's LSTM (the default; its backward computes the frozen decoder LSTM's weight gradients anyway)
against PyTorch's native LSTM (`torch.backends.mkldnn.flags(enabled=False)`: per-op autograd, which
skips gradients nobody needs), and a full step (nothing frozen) for scale. One batch of 32 random
texts of `--length` tokens, `loss_terms` + backward, the three alternated `--rounds` times.

    python scripts/bench_frozen_decoder.py [small] [paper] [--rounds 15] [--length 40] [--threads 1]

Prints the median milliseconds per step of each and the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from seqvae.core.model import SeqVAE
from seqvae.training.allocator import reuse_freed_memory

CONFIGS = {"small": (dict(embed_dim=64, hidden_dim=128, latent_dim=32), 5000),
           "paper": (dict(embed_dim=512, hidden_dim=1024, latent_dim=32), 20000)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="*", default=["small"], choices=list(CONFIGS))
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--length", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    reuse_freed_memory()
    torch.set_num_threads(a.threads)
    for name in a.configs:
        cfg, vocab = CONFIGS[name]
        torch.manual_seed(0)
        model = SeqVAE(vocab, **cfg).train()
        tokens = torch.randint(4, vocab, (32, a.length))
        batch = {"tokens": tokens, "lengths": torch.full((32,), a.length)}

        def step(onednn: bool, frozen: bool = True) -> float:
            decoder = list(model.decoder.parameters())
            for q in decoder:
                q.requires_grad_(not frozen)
            start = time.perf_counter()
            with torch.backends.mkldnn.flags(enabled=onednn):
                loss = model.loss_terms(batch, 0.5)["loss"]
                model.zero_grad()
                loss.backward()
            for q in decoder:
                q.requires_grad_(True)
            return time.perf_counter() - start

        for _ in range(2):  # warm-up
            step(True), step(False)
        times = {"oneDNN, decoder frozen": [], "native, decoder frozen": [], "oneDNN, full step": []}
        for _ in range(a.rounds):
            times["oneDNN, decoder frozen"].append(step(True))
            times["native, decoder frozen"].append(step(False))
            times["oneDNN, full step"].append(step(True, frozen=False))
        med = {k: 1000 * statistics.median(v) for k, v in times.items()}
        print(f"{name} (32 x {a.length} tokens, {a.threads} thread(s), {a.rounds} rounds): "
              + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()) + f"; 1-min load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
