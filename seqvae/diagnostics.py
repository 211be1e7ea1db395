"""Is the encoder learning at all? Per-parameter norms (now, and for a fresh initialisation of
the same model), gradient norms of the reconstruction term on a few training batches, the share
of the step that gradient clipping leaves, and how much the encoder features vary across texts.

    seqvae diagnose RUN_DIR [--batches 3] [--checkpoint best|last]

RUN_DIR is a run directory (config.yaml, checkpoints/). Reads the run's own training data.
A collapsed run whose encoder weights are still at their initial scale, with features that vary
across texts by a fraction of a percent of their size, never learned to encode: the collapse is
upstream of the KL term (an autoencoder with KL weight 0 can show it too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml

from seqvae.core import elbo
from seqvae.core.model import SeqVAE
from seqvae.text.datamodule import TextDataModule


def refuse(prog: str, message: str) -> SystemExit:
    """One line on stderr and exit 2, as every seqvae command refuses bad input."""
    print(f"seqvae {prog}: error: {message}", file=sys.stderr)
    return SystemExit(2)


def open_run(run: Path, checkpoint: str, prog: str) -> tuple[SeqVAE, TextDataModule]:
    """A run directory's model (its `checkpoint`.ckpt, read through the one weights-only loader)
    and its data module (its config.yaml's data section), or one line naming what is missing.
    Before: a missing config.yaml, a checkpoint that is not one, or data paths that do not
    resolve from the current directory were tracebacks."""
    from seqvae.errors import CorpusError
    from seqvae.store.checkpoints import load_checkpoint, require_run_checkpoint
    from seqvae.store.files import CONFIG

    ckpt = run / "checkpoints" / f"{checkpoint}.ckpt"
    if not (run / CONFIG).is_file():
        raise refuse(prog, f"{run}: no config.yaml (not a run directory of seqvae fit)")
    if not ckpt.is_file():
        raise refuse(prog, f"{ckpt}: no such checkpoint")
    try:
        require_run_checkpoint(load_checkpoint(ckpt, "RUN_DIR"), ckpt, "RUN_DIR")
        model = SeqVAE.load_from_checkpoint(ckpt, map_location="cpu")
        config = yaml.safe_load((run / CONFIG).read_text(encoding="utf-8")) or {}
        dm = TextDataModule(**(config.get("data") or {}))
    except CorpusError as err:  # relative data paths are read from the current directory, as fit read them
        raise refuse(prog, " ".join(str(err).split())) from None
    if model.encoder is None:
        raise refuse(prog, f"{ckpt}: a language model has no encoder")
    return model, dm


def diagnose(run: Path, checkpoint: str = "best", batches: int = 3, seed: int = 0) -> dict:
    model, dm = open_run(run, checkpoint, "diagnose")
    pl.seed_everything(seed, verbose=False)
    fresh = SeqVAE(**{k: v for k, v in model.hparams.items() if k != "init_encoder_from"})
    dm.setup("fit")
    model.train()
    torch.manual_seed(seed)
    params = dict(model.named_parameters())
    grads = {n: 0.0 for n in params}
    clip = model.hparams.grad_clip
    rows = {"feature_std": [], "feature_abs": [], "mu_std": [], "clip_factor": []}
    for _, batch in zip(range(batches), dm.train_dataloader()):
        model.zero_grad()
        tokens, lengths = batch["tokens"], batch["lengths"]
        q, h = model.encoder.encode(tokens, lengths)
        mu = q.mean
        rec = elbo.elbo_terms(model.decoder, q, tokens, lengths).rec.mean()
        rec.backward()
        total = torch.sqrt(sum(p.grad.pow(2).sum() for p in params.values() if p.grad is not None))
        for n, p in params.items():
            grads[n] += 0.0 if p.grad is None else float(p.grad.norm()) / batches
        if len(lengths) > 1:
            rows["feature_std"].append(float(h.detach().std(0).mean()))
            rows["mu_std"].append(float(mu.detach().std(0).mean()))
        rows["feature_abs"].append(float(h.detach().abs().mean()))
        rows["clip_factor"].append(min(1.0, clip / float(total)) if clip else 1.0)
    init = dict(fresh.named_parameters())
    norms = {
        n: {"norm": float(p.detach().norm()), "fresh_norm": float(init[n].detach().norm()), "grad": grads[n]}
        for n, p in params.items()
    }
    return {"params": norms, **{k: sum(v) / len(v) if v else float("nan") for k, v in rows.items()}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqvae diagnose", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("run", type=Path)
    p.add_argument("--checkpoint", default="best", choices=["best", "last"])
    p.add_argument("--batches", type=int, default=3)
    args = p.parse_args(argv)
    if args.batches < 1:  # 0 batches would print zero gradients, which read as "the encoder is not learning"
        p.error(f"--batches: must be >= 1, got {args.batches}")
    d = diagnose(args.run, args.checkpoint, args.batches)
    print(f"{args.run} ({args.checkpoint}.ckpt), reconstruction-term gradients over {args.batches} training batches")
    print(f"{'parameter':34s} {'norm':>9s} {'fresh init':>10s} {'|grad|':>9s}")
    for n, r in d["params"].items():
        if n.startswith("encoder.") or "z_to" in n:
            print(f"{n:34s} {r['norm']:9.3f} {r['fresh_norm']:10.3f} {r['grad']:9.5f}")
    enc = sum(r["grad"] ** 2 for n, r in d["params"].items() if n.startswith("encoder.")) ** 0.5
    dec = sum(r["grad"] ** 2 for n, r in d["params"].items() if n.startswith("decoder.")) ** 0.5
    print(f"gradient norm: encoder {enc:.4f}, decoder {dec:.4f}; clipping keeps {d['clip_factor']:.3f} of the step")
    print(
        f"encoder features: mean |h| {d['feature_abs']:.4f}, std across texts {d['feature_std']:.6f} "
        f"({100 * d['feature_std'] / d['feature_abs']:.2f}% of |h|); posterior means: std across texts {d['mu_std']:.6f}"
    )
    return 0
