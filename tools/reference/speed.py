#!/usr/bin/env python
"""seqvae's speed side by side with He et al.'s code (github.com/jxhe/vae-lagging-encoder), on the
same batches, in alternated child processes, and what the difference is made of.

    python -m tools.reference.speed --he /work/ref/he_clean [--he-commit SHA] [--configs small,paper]
        [--rounds 3] [--threads 1] [--json PATH]

Nothing of the reference is kept in the repository: its ``modules/`` tree is copied from a clean
clone (``--he``) into a temporary directory and patched as ``work_copy.HE_PATCHES`` lists (the
deprecated ``reduce=False``); each child imports it from there. Per config (bench.py's small and
paper sizes, dropout 0.5/0.5 as both codes' Yahoo settings) and part, five variants run, each in
its own process (its own heap, its own peak RSS), in an order rotated every round:

- ``reference``: He et al.'s ``VAE`` as ``text.py`` trains it (both ``zero_grad``s, ``loss(x, kl_weight,
  nsamples=1).mean()``, backward, clip 5 over all parameters, both SGD steps) and as
  ``calc_iwnll`` evaluates it (``nll_iw`` of one text, K = 500 in calls of ns = 100); glibc's
  default malloc;
- ``reference + mallopt``: the same, after ``seqvae.allocator.reuse_freed_memory()`` (the two
  ``mallopt`` calls the ``seqvae`` command makes at start-up);
- ``seqvae``: what ``seqvae`` runs (``loss_terms``, ``iw_nll`` with ``iw_chunk`` samples per decoder
  call, fused output layer, the mallopt setting): bench.py's own ``train_direct`` / ``iw_bench``;
- ``seqvae, plain output``: ``fused_output=False``;
- ``seqvae, glibc default``: no mallopt.

Parts: ``train`` (bench.py's quick batches: one warm-up step at 24 tokens, then the batches closest
to Yahoo's mean length), ``iw`` (one text, K = 500, after one warm-up decoder call) and, small config
only, ``inner`` (the aggressive inner encoder step: the reference computes every gradient and clips
all parameters, seqvae freezes the decoder's weights; bench.py's ``module_step``). Each variant
builds its own initial weights (each code's own initialiser): the work per step does not depend on
the values. Printed: per variant the median seconds over rounds, each round's peak RSS, and the
median (min-max) over rounds of reference ÷ variant time, i.e. how many times faster than the
reference it is.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from tools.reference.work_copy import HE_PATCHES, clone_commit, prepare_work

REPO = Path(__file__).resolve().parents[2]

VARIANTS = {  # name: (code, fused_output, mallopt)
    "reference": ("reference", None, False),
    "reference + mallopt": ("reference", None, True),
    "seqvae": ("seqvae", True, True),
    "seqvae, plain output": ("seqvae", False, True),
    "seqvae, glibc default": ("seqvae", True, False),
}
PARTS = {"small": ("train", "inner", "iw"), "paper": ("train", "iw")}
IW_SAMPLES, REFERENCE_NS, CLIP = 500, 100, 5.0


def reference_model(cfg: dict, he_work: str):
    """He et al.'s VAE at `cfg`'s size, built as text.py builds it (its initialisers included)."""
    import torch
    from torch import nn

    sys.path.insert(0, he_work)
    from modules import VAE, LSTMDecoder, LSTMEncoder  # the patched copy outside the repository

    def uniform(stdv):
        return lambda tensor: nn.init.uniform_(tensor, -stdv, stdv)

    args = SimpleNamespace(ni=cfg["embed_dim"], enc_nh=cfg["hidden_dim"], dec_nh=cfg["hidden_dim"], nz=cfg["latent_dim"],
                           dec_dropout_in=0.5, dec_dropout_out=0.5, device=torch.device("cpu"))  # fmt: skip
    vocab = range(cfg["vocab_size"])  # the decoder's constructor only takes len(vocab)
    encoder = LSTMEncoder(args, cfg["vocab_size"], uniform(0.01), uniform(0.1))
    return VAE(encoder, LSTMDecoder(args, vocab, uniform(0.01), uniform(0.1)), args)


def reference_step(vae, x, optimizers, stepped):
    """One update as text.py makes it: every gradient, clip over all parameters, `stepped` SGD steps."""
    import torch

    for opt in optimizers:
        opt.zero_grad()
    loss, _, _ = vae.loss(x, 1.0, nsamples=1)
    loss.mean(dim=-1).backward()
    torch.nn.utils.clip_grad_norm_(vae.parameters(), CLIP)
    for opt in stepped:
        opt.step()


def measure(spec: dict) -> dict:
    """One variant × config × part, in this (child) process; returns seconds per step or text."""
    import torch

    from benchmarks import bench  # the same batches, configs and seqvae loops as the benchmark
    from benchmarks.gemm_peak import clock
    from seqvae.core.model import SeqVAE

    code, cfg, part = spec["code"], bench.CONFIGS[spec["config"]], spec["part"]
    warm, steps, _ = bench.QUICK[spec["config"]]
    batches, _ = bench.yahoo_batches(Path(spec["data"]), cfg["vocab_size"], steps)
    warm_batches = [{"tokens": b["tokens"][:, : bench.WARM_T], "lengths": torch.full((bench.BATCH,), bench.WARM_T)}
                    for b in batches[:warm]]  # fmt: skip
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    if code == "reference":
        vae = reference_model(cfg, spec["he_work"])
        enc_opt = torch.optim.SGD(vae.encoder.parameters(), lr=1.0)
        dec_opt = torch.optim.SGD(vae.decoder.parameters(), lr=1.0)
        if part == "iw":
            x = batches[0]["tokens"][:1]
            vae.eval()
            with torch.no_grad():
                vae.nll_iw(x, REFERENCE_NS, ns=REFERENCE_NS)  # warm-up: one decoder call
                start = clock(cpu)
                vae.nll_iw(x, IW_SAMPLES, ns=REFERENCE_NS)
                seconds = clock(cpu) - start
        else:
            vae.train()
            stepped = [enc_opt, dec_opt] if part == "train" else [enc_opt]
            for i, b in enumerate(warm_batches + batches):
                if i == warm:
                    start = clock(cpu)
                reference_step(vae, b["tokens"], [enc_opt, dec_opt], stepped)
            seconds = (clock(cpu) - start) / steps
    else:
        model = SeqVAE(**cfg, fused_output=spec["fused"])
        if part == "iw":
            seconds, _ = bench.iw_bench(model, batches[0], 1, IW_SAMPLES, cpu, False)
        elif part == "train":
            seconds = bench.train_direct(model, warm_batches + batches, warm, cpu, False) / steps
        else:
            model.train()
            for i, b in enumerate(warm_batches + batches):
                if i == warm:
                    start = clock(cpu)
                bench.module_step(model, b, model.encoder, [model.decoder], cpu, False)
            seconds = (clock(cpu) - start) / steps
    return {"seconds": seconds, "max_rss_mib": bench.memory(cpu)["max_rss_mib"]}


def run_child(spec: dict, threads: int) -> dict:
    cmd = [sys.executable, "-m", "tools.reference.speed", "--child", json.dumps(spec), "--threads", str(threads)]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"child {spec} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--he", type=Path, help="a clean clone of jxhe/vae-lagging-encoder")
    p.add_argument("--he-commit", help="the clone's commit, where --he has no .git (recorded in the JSON)")
    p.add_argument("--configs", default="small,paper")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--data", type=Path, default=REPO.parent / "shared/data/yahoo/valid.txt")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        spec = json.loads(a.child)
        if spec["mallopt"]:
            from seqvae.training.allocator import reuse_freed_memory

            reuse_freed_memory()  # before any tensor, as the seqvae command does
        import torch

        torch.set_num_threads(a.threads)
        print("RESULT " + json.dumps(measure(spec)))
        return 0
    if a.he is None or not (a.he / "modules" / "vae.py").is_file():
        p.error(f"--he {a.he}: not a clone of jxhe/vae-lagging-encoder (no modules/vae.py)")
    began, load0 = time.perf_counter(), os.getloadavg()
    res = {"command": " ".join(["python", "-m", "tools.reference.speed", *(argv or sys.argv[1:])]), "threads": a.threads,
           "rounds": a.rounds, "he_commit": a.he_commit or clone_commit(a.he), "loadavg_start": load0, "parts": {}}  # fmt: skip
    print(f"He et al. {res['he_commit'] or '(commit unknown)'}; {a.threads} thread(s), {a.rounds} rounds, "
          f"1-min load {load0[0]:.2f}; one child process per variant, order rotated each round")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="seqvae-refspeed-") as tmp:
        res["patches"] = prepare_work(a.he, Path(tmp) / "he", HE_PATCHES)
        names = list(VARIANTS)
        for config in a.configs.split(","):
            for part in PARTS[config]:
                times = {n: [] for n in names}
                rss = {}
                for r in range(a.rounds):
                    for n in names[r % len(names) :] + names[: r % len(names)]:
                        code, fused, mallopt = VARIANTS[n]
                        spec = {"code": code, "fused": fused, "mallopt": mallopt, "config": config, "part": part,
                                "data": str(a.data), "he_work": str(Path(tmp) / "he")}  # fmt: skip
                        out = run_child(spec, a.threads)
                        times[n].append(out["seconds"])
                        rss.setdefault(n, []).append(out["max_rss_mib"])
                unit = "s/text" if part == "iw" else "s/step"
                print(f"\n[{config}] {part} ({unit}; ratio = reference time / variant time, median (min-max) of rounds)")
                rows = {}
                for n in names:
                    ratios = [ref / t for ref, t in zip(times["reference"], times[n])]
                    rows[n] = {"seconds": times[n], "median_s": statistics.median(times[n]), "max_rss_mib": rss[n],
                               "speed_vs_reference": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)]}  # fmt: skip
                    print(f"  {n:<24}{rows[n]['median_s']:9.4f} {unit}  {rows[n]['speed_vs_reference']:5.2f}x "
                          f"({min(ratios):.2f}-{max(ratios):.2f})  peak RSS {'/'.join(f'{m:.0f}' for m in rss[n])} MiB")  # fmt: skip
                res["parts"][f"{config} {part}"] = rows
                if a.json:  # after every part: a run cut short keeps what it measured
                    a.json.write_text(json.dumps(res, indent=2) + "\n")
    res["loadavg_end"], res["wall_s"] = os.getloadavg(), time.perf_counter() - began
    print(f"\ntotal {res['wall_s']:.0f} s; 1-min load at end {res['loadavg_end'][0]:.2f}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
