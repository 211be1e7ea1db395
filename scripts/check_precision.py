"""Does bf16 training reproduce fp32's collapse metrics? (issue 21: the collapse comparisons train
in fp32 by default; bf16 stays an option only if it gives the same KL / AU / MI.)

    python scripts/check_precision.py [--seeds 1,2,3] [--epochs 3] [--json F]

A tiny BN-VAE (emb 16, LSTM 32, z 8, γ 0.6: a model whose encoder is active, so the metrics have
something to lose) on 400 synthetic texts, trained with `precision="32-true"` and with
`"bf16-mixed"` (CPU autocast: the GEMMs in bf16), for each seed and for the fused and the plain
output layer, then tested in fp32 (10 importance samples). Prints every run and, per output
layer and metric, the difference bf16 − fp32 paired by seed with its 95% t-interval (`*`: the
interval excludes 0). One thread; about 5 s per run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the tests' synthetic corpus writer

METRICS = ("test/kl", "test/au", "test/mi", "test/mi_dataset", "test/iw_nll")


def train_and_test(root: Path, seed: int, precision: str, fused: bool, epochs: int) -> dict:
    import pytorch_lightning as pl
    from test_model import datamodule, tiny_model

    common = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    pl.seed_everything(seed, verbose=False)
    dm = datamodule(root)
    model = tiny_model(dm.vocab_size, embed_dim=16, hidden_dim=32, latent_dim=8, bn_gamma=0.6, test_iw_samples=10,
                       fused_output=fused)  # fmt: skip
    pl.Trainer(max_epochs=epochs, precision=precision, **common).fit(model, dm)
    result = pl.Trainer(precision="32-true", **common).test(model, dm, verbose=False)[0]
    return {k: float(result[k]) for k in METRICS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import logging
    import warnings

    import torch
    from test_model import write_corpus

    from seqvae.differences import t975

    torch.set_num_threads(1)
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(tempfile.mkdtemp())
    for name, n, s in (("train.txt", 400, 0), ("valid.txt", 60, 1), ("test.txt", 60, 2)):
        write_corpus(root / name, n, s)
    runs = []
    print(f"{'layer':<6} {'precision':<11} {'seed':>4}  " + "  ".join(f"{m[5:]:>10}" for m in METRICS))
    for fused in (True, False):
        for seed in seeds:
            for precision in ("32-true", "bf16-mixed"):
                r = train_and_test(root, seed, precision, fused, args.epochs)
                runs.append({"fused": fused, "seed": seed, "precision": precision, **r})
                layer = "fused" if fused else "plain"
                print(f"{layer:<6} {precision:<11} {seed:>4}  " + "  ".join(f"{r[m]:>10.3f}" for m in METRICS), flush=True)
    print(f"\nbf16 − fp32, paired by seed (n = {len(seeds)}), mean [95% interval]; * excludes 0")
    for fused in (True, False):
        cells = []
        for m in METRICS:
            by = {(r["seed"], r["precision"]): r[m] for r in runs if r["fused"] == fused}
            d = [by[(s, "bf16-mixed")] - by[(s, "32-true")] for s in seeds]
            mean = statistics.fmean(d)
            if len(d) > 1:
                half = t975(len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
                star = "*" if mean - half > 0 or mean + half < 0 else ""
                cells.append(f"{m[5:]} {mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]{star}")
            else:
                cells.append(f"{m[5:]} {mean:+.3f} (one seed)")
        print(f"{'fused' if fused else 'plain'}: " + "; ".join(cells))
    if args.json:
        args.json.write_text(json.dumps({"epochs": args.epochs, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
