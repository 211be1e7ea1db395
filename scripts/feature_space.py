"""The paper's Figure 2 (Long et al. §4.2-4.3): encoder feature space of 3-unit-encoder / 3-d-latent
SeqVAEs on the validation set, for the last-state encoder, the last-state encoder with the cosine
regulariser, and the max-pooled encoder; one 3-D scatter per model with the mean pairwise cosine
of its features in the title, plus all three side by side (same axes, centred on 0).

    python scripts/feature_space.py                       # demo corpus, 5 epochs: a few minutes on CPU
    python scripts/feature_space.py --dataset yahoo10k    # yahoo10k (20 epochs, about an hour on CPU)
    python scripts/feature_space.py --out DIR --epochs N --config EXTRA.yaml …

The models are trained as a `seqvae sweep` grid (resumable; run directories that finished are
loaded, not retrained) under `--root` (default runs/feature_space/<dataset>), with
configs/yahoo10k/{last,cosine,max}.yaml on top of the dataset's base config and
model.hidden_dim = model.latent_dim = 3. The hidden size is shared by encoder and decoder in
SeqVAE, so the decoder has 3 units too (the paper only states the encoder's size). Features are the
encoder's pooled LSTM states h (what the cosine regulariser and `feature_cos` see), computed by
`model.encoder.features` in eval mode. PNGs go to docs/figures/feature_space/ (or `--out`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

from seqvae import SeqVAE
from seqvae.data import read_corpus, resolve_splits
from seqvae.grid import GridError, grid_cells
from seqvae.losses import mean_pairwise_cosine
from seqvae.sweep import run_grid

DATASETS = {
    "demo": {"configs": ["configs/demo.yaml"], "epochs": 5},
    "yahoo10k": {"configs": ["configs/yahoo10k/base.yaml"], "epochs": 20},
}
VARIANTS = {
    "last": ("configs/yahoo10k/last.yaml", "last state"),
    "cosine": ("configs/yahoo10k/cosine.yaml", "last state + cosine regulariser"),
    "max": ("configs/yahoo10k/max.yaml", "max pooling"),
}


def validation_texts(run_dir: Path) -> list[list[str]]:
    """The validation split of the run, read the way its config.yaml says."""
    data = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {})["data"]
    splits = resolve_splits(*(data.get(k) for k in ("train", "val", "test", "train_lines", "val_lines", "test_lines")))
    return read_corpus(*splits["val"], data.get("label_column") or False, data.get("max_length")).texts


def scatter(ax, h: torch.Tensor, title: str, max_points: int, lim: float) -> None:
    pts = h[torch.randperm(len(h), generator=torch.Generator().manual_seed(0))[:max_points]] if len(h) > max_points else h
    ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], s=4, alpha=0.5)
    ax.set(title=title, xlabel="h1", ylabel="h2", zlabel="h3", xlim=(-lim, lim), ylim=(-lim, lim), zlim=(-lim, lim))
    ax.title.set_fontsize("small")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Figure 2: 3-D encoder feature spaces (last, cosine, max).")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="demo")
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="extra config on top (repeatable)")
    parser.add_argument("--epochs", type=int, help="trainer.max_epochs (default: demo 5, yahoo10k 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--root", help="run directories: ROOT/<variant>/seed<N> (default runs/feature_space/<dataset>)")
    parser.add_argument("--out", type=Path, default=Path("docs/figures/feature_space"), help="where the PNGs go")
    parser.add_argument("--max-points", type=int, default=3000, help="points drawn per model (the cosine uses all)")
    args = parser.parse_args(argv)
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("feature_space: error: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return 2
    dataset = DATASETS[args.dataset]
    grid = {
        "root": args.root or f"runs/feature_space/{args.dataset}",
        "configs": dataset["configs"] + args.config,
        "overrides": {
            "model.hidden_dim": 3,
            "model.latent_dim": 3,
            "trainer.max_epochs": args.epochs or dataset["epochs"],
            "model.val_iw_samples": 0,
            "model.test_iw_samples": 10,
            "model.bn_gamma": None,  # the paper's plain VAEs (the demo config adds BN-VAE)
        },
        "seeds": [args.seed],
        "variants": [{"name": v, "configs": [VARIANTS[v][0]]} for v in args.variants],
    }
    try:
        cells = grid_cells(grid, "feature_space")
    except GridError as err:
        print(f"feature_space: error: {err}", file=sys.stderr)
        return 2
    failed = run_grid(cells)
    args.out.mkdir(parents=True, exist_ok=True)
    done = [c for c in cells if c not in failed]
    panels = []
    for cell in done:
        model = SeqVAE.load_from_checkpoint(cell.run_dir / "checkpoints" / "best.ckpt", map_location="cpu")
        h = model.features([" ".join(t) for t in validation_texts(cell.run_dir)], batch_size=256)
        cos = float(mean_pairwise_cosine(h))
        title = f"{VARIANTS[cell.variant][1]}\nmean pairwise cosine {cos:.3f} ({len(h)} validation texts)"
        panels.append((cell.variant, h, title, cos))
    # One scale for every panel, centred on the origin (where cosines are measured from), so a
    # concentrated feature space looks concentrated next to a dispersed one.
    lim = 1.05 * max((float(h.abs().max()) for _, h, _, _ in panels), default=1.0) or 1.0
    for variant, h, title, cos in panels:
        fig = Figure(figsize=(5, 5.4))
        scatter(fig.add_subplot(projection="3d"), h, title, args.max_points, lim)
        fig.subplots_adjust(left=0.02, right=0.92, bottom=0.03, top=0.9)
        png = args.out / f"{args.dataset}_{variant}.png"
        fig.savefig(png, dpi=100)
        print(f"{variant}: mean pairwise cosine {cos:.4f} over {len(h)} texts -> {png}")
    if len(panels) > 1:
        fig = Figure(figsize=(5 * len(panels), 5.4))
        for i, (_, h, title, _) in enumerate(panels):
            scatter(fig.add_subplot(1, len(panels), i + 1, projection="3d"), h, title, args.max_points, lim)
        fig.subplots_adjust(left=0.01, right=0.97, bottom=0.03, top=0.9, wspace=0.08)
        fig.savefig(args.out / f"{args.dataset}.png", dpi=100)
        print(f"all: {args.out / f'{args.dataset}.png'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
