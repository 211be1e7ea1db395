"""CPU time of training steps and IW-NLL with glibc's default malloc and with seqvae's setting.

    python scripts/bench_malloc.py [--steps 10] [--docs 4] [--iw-samples 100]

Each setting runs in its own process (the allocator's thresholds are per process): the yahoo10k
model (embedding 64, LSTM 128, z 32, 5,004 words), one torch thread, training steps on a batch of
32 random texts of 80 tokens, then IW-NLL of --docs such texts. Per step/document it prints wall
seconds, user and system CPU seconds and minor page faults (getrusage). System time and faults
are what `seqvae.allocator.reuse_freed_memory` removes; other processes on the machine inflate
wall time, not the CPU times of this one. It also prints the last training loss and the IW-NLL
sum under each setting: they must be equal to the last bit.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SETTINGS = ("glibc default", "reuse_freed_memory")


def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


def per_item(a, b, n):
    return {"wall_s": (b[0] - a[0]) / n, "user_s": (b[1] - a[1]) / n, "sys_s": (b[2] - a[2]) / n, "faults": (b[3] - a[3]) / n}


def measure(setting: str, steps: int, docs: int, iw_samples: int) -> dict:
    import torch

    from seqvae.allocator import reuse_freed_memory
    from seqvae.metrics import iw_nll
    from seqvae.model import SeqVAE

    applied = reuse_freed_memory() if setting == SETTINGS[1] else False
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = SeqVAE(vocab_size=5004, embed_dim=64, hidden_dim=128, latent_dim=32)
    model.eval()  # IW-NLL of the initial weights
    tokens, lengths = torch.randint(4, 5004, (docs, 80)), torch.full((docs,), 80)

    def iw():
        mu, logvar, _ = model.encoder(tokens, lengths)
        ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
        return iw_nll(ll, mu, logvar, iw_samples, model.iw_chunk(tokens))

    with torch.no_grad():
        iw()  # warm-up
        start = usage()
        nll = iw()
    per_doc = per_item(start, usage(), docs)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # lr 1 on one repeated random batch diverges
    batch = {"tokens": torch.randint(4, 5004, (32, 80)), "lengths": torch.full((32,), 80)}
    warm = 3
    for i in range(warm + steps):
        if i == warm:
            start = usage()
        opt.zero_grad()
        loss = model.loss_terms(batch, 1.0)["loss"]
        loss.backward()
        opt.step()
    train = per_item(start, usage(), steps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # The same numbers under both settings: the allocator changes where tensors live, not values.
    values = {"last_loss": float(loss), "iw_nll_sum": float(nll.sum())}
    return {"setting": setting, "values": values, "applied": applied, "train_step": train, "iw_doc": per_doc, "max_rss_mib": rss}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--iw-samples", type=int, default=100)
    p.add_argument("--child", choices=SETTINGS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.steps, args.docs, args.iw_samples)))
        return 0
    print(f"{os.cpu_count()} CPU cores, 1-min load average {os.getloadavg()[0]:.2f}; "
          f"{args.steps} training steps of 32 x 80 tokens, IW-NLL of {args.docs} texts with K = {args.iw_samples}")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for setting in SETTINGS:
        cmd = [sys.executable, __file__, "--child", setting, "--steps", str(args.steps), "--docs", str(args.docs),
               "--iw-samples", str(args.iw_samples)]  # fmt: skip
        r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        for what in ("train_step", "iw_doc"):
            m = r[what]
            print(f"{setting:<20} {what:<11} {m['wall_s']:6.3f} s wall  {m['user_s']:6.3f} s user  "
                  f"{m['sys_s']:6.3f} s sys  {m['faults']:8.0f} minor faults")  # fmt: skip
        print(f"{setting:<20} last training loss {r['values']['last_loss']!r}, IW-NLL sum {r['values']['iw_nll_sum']!r}")
        note = "" if r["applied"] or setting == SETTINGS[0] else " (not applied: not glibc)"
        print(f"{setting:<20} max RSS {r['max_rss_mib']:.0f} MiB{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
