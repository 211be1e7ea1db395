#!/usr/bin/env python
"""Seconds per training step, `last` against SA-VAE (`model.refine`, 10 SVI steps), in one process:
`python -m benchmarks.sa_vae [--steps 3]` (docs/sa_vae.md). Two shapes: the demo config's network
(emb 64, LSTM 128, z 16; V 2777, a batch of 32 texts of the median 23 words + `<s>`, `</s>`) and a
yahoo10k-sized batch (emb 64, LSTM 128, z 32; V 5004, 32 texts of 81 tokens, yahoo's mean length).
A step is what `SeqVAE.update_step` does: the loss, its backward, the clip, one SGD step; random
tokens (the cost does not depend on which words). Wall and process-CPU seconds per step (median over
`--steps` after one warm-up step), one thread, with the load average, because the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

SHAPES = {
    "demo": {"net": dict(embed_dim=64, hidden_dim=128, latent_dim=16), "vocab": 2777, "length": 25},
    "yahoo10k": {"net": dict(embed_dim=64, hidden_dim=128, latent_dim=32), "vocab": 5004, "length": 81},
}


def step_seconds(shape: dict, refine, steps: int) -> tuple[float, float, float]:
    from seqvae import SeqVAE

    torch.manual_seed(0)
    model = SeqVAE(vocab_size=shape["vocab"], pooling="last", refine=refine, **shape["net"])
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    tokens = torch.randint(4, shape["vocab"], (32, shape["length"]))
    tokens[:, 0], tokens[:, -1] = 1, 2
    batch = {"tokens": tokens, "lengths": torch.full((32,), shape["length"])}
    wall, cpu = [], []
    for i in range(steps + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss = model.loss_terms(batch, 0.5)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        if i:  # the first step warms the allocator up
            wall.append(time.perf_counter() - w0)
            cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu), float(loss)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    from seqvae import SVIRefinement

    print(f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}, torch {torch.__version__}")
    print("| shape | variant | wall s/step | CPU s/step | CPU × last |")
    print("|---|---|---|---|---|")
    for name, shape in SHAPES.items():
        base = None
        for variant, refine in (("last", None), ("sa_vae (10 SVI steps)", SVIRefinement(steps=10))):
            wall, cpu, _ = step_seconds(shape, refine, a.steps)
            base = base or cpu
            print(f"| {name} | {variant} | {wall:.3f} | {cpu:.3f} | {cpu / base:.1f} |", flush=True)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
