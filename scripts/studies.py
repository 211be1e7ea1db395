"""One-off studies whose figures the docs quote, as subcommands of one developer tool:

    python scripts/studies.py precision [--seeds 1,2,3] [--epochs 3] [--json F]
    python scripts/studies.py mi-noise [--texts 1000 --latent 32 --batch 32 --seeds 200]
    python scripts/studies.py feature-space [--dataset demo|yahoo10k] [--out DIR] …
    python scripts/studies.py long-warmup-updates [--out docs/figures] [--no-plots]   (scripts/long_warmup.py)

precision: Does bf16 training reproduce fp32's collapse metrics? (issue 21: the collapse comparisons train
in fp32 by default; bf16 stays an option only if it gives the same KL / AU / MI.)

mi-noise: Monte-Carlo noise of the MI estimators on posteriors that ignore x (true MI 0).

feature-space: The paper's Figure 2 (Long et al. §4.2-4.3): encoder feature space of 3-unit-encoder / 3-d-latent
SeqVAEs on the validation set, for the last-state encoder, the last-state encoder with the cosine
regulariser, and the max-pooled encoder; one 3-D scatter per model with the mean pairwise cosine
of its features in the title, plus all three side by side (same axes, centred on 0).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from seqvae import SeqVAE
from seqvae.core.losses import mean_pairwise_cosine
from seqvae.core.metrics import mutual_information
from seqvae.experiments.grid import GridError, grid_cells
from seqvae.experiments.schedule import run_grid
from seqvae.rundir.curves import write_curves
from seqvae.text.corpus import read_corpus
from seqvae.text.splits import resolve_splits

# ---------------------------------------------------------------- check precision
# Does bf16 training reproduce fp32's collapse metrics? (issue 21: the collapse comparisons train
# in fp32 by default; bf16 stays an option only if it gives the same KL / AU / MI.)
#
#     python scripts/studies.py precision [--seeds 1,2,3] [--epochs 3] [--json F]
#
# A tiny BN-VAE (emb 16, LSTM 32, z 8, γ 0.6: a model whose encoder is active, so the metrics have
# something to lose) on 400 synthetic texts, trained with `precision="32-true"` and with
# `"bf16-mixed"` (CPU autocast: the GEMMs in bf16), for each seed and for the fused and the plain
# output layer, then tested in fp32 (10 importance samples). Prints every run and, per output
# layer and metric, the difference bf16 − fp32 paired by seed with its 95% t-interval (`*`: the
# interval excludes 0). One thread; about 5 s per run.

ROOT = Path(__file__).resolve().parents[1]


WORDS = "the a cat dog sat ran on under mat log big small red blue".split()


def write_corpus(path: Path, n: int, seed: int, min_len: int = 2, max_len: int = 9) -> None:
    """n synthetic texts of 2-9 words from WORDS (the same generator as the tests' corpus, so the
    precision study's committed figures stay those of this code)."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n")


METRICS = ("test/kl", "test/au", "test/mi", "test/mi_dataset", "test/iw_nll")


def train_and_test(root: Path, seed: int, precision: str, fused: bool, epochs: int) -> dict:
    import pytorch_lightning as pl

    from seqvae.text.datamodule import TextDataModule

    common = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    pl.seed_everything(seed, verbose=False)
    dm = TextDataModule(*(str(root / f) for f in ("train.txt", "valid.txt", "test.txt")), batch_size=8)
    model = SeqVAE(dm.vocab_size, embed_dim=16, hidden_dim=32, latent_dim=8, bn_gamma=0.6, val_iw_samples=0,
                   test_iw_samples=10, fused_output=fused)  # fmt: skip
    pl.Trainer(max_epochs=epochs, precision=precision, **common).fit(model, dm)
    result = pl.Trainer(precision="32-true", **common).test(model, dm, verbose=False)[0]
    return {k: float(result[k]) for k in METRICS}


def precision_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import logging
    import warnings

    import torch

    from seqvae.analysis.differences import t975

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


# ---------------------------------------------------------------- mi noise
# Monte-Carlo noise of the MI estimators on posteriors that ignore x (true MI 0).
#
# Every one of M texts gets the same posterior N(0, I) in Z dimensions, as a fully collapsed
# encoder gives, so I(x; z) = 0 exactly and whatever the estimator reports is its noise. For each
# of R evaluation seeds this computes:
#   - `mi_dataset` as `seqvae test` does: the pool of all M posteriors, 10 z per posterior;
#   - the same pool with 1 z per posterior (He et al.'s estimator on the whole set);
#   - `mi` as validation/test log it: the pool of each batch of B texts, 1 z per posterior,
#     averaged over batches weighted by their size;
# and prints each one's mean and standard deviation over the seeds, beside the closed form of
# the pooled one-sample s.d.: with identical posteriors log q(z) = log N(z; 0, I), whose s.d. is
# sqrt(Z/2), so the estimate's s.d. is sqrt(Z/2) / sqrt(M·S).
#
#     python scripts/studies.py mi-noise                    # M 1000, Z 32, B 32, 200 seeds
#     python scripts/studies.py mi-noise --texts 10000 --seeds 50

def mi_noise_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=1000, help="M, the pool of posteriors")
    parser.add_argument("--latent", type=int, default=32, help="Z")
    parser.add_argument("--batch", type=int, default=32, help="B, the per-batch pool of `mi`")
    parser.add_argument("--seeds", type=int, default=200, help="R, evaluation seeds")
    args = parser.parse_args()
    m, nz, b = args.texts, args.latent, args.batch
    mu = torch.zeros(m, nz, dtype=torch.float64)
    logvar = torch.zeros(m, nz, dtype=torch.float64)
    rows = {"mi_dataset (pool M, 10 z each)": [], "pool M, 1 z each": [], f"mi (pool of each batch of {b}, 1 z)": []}
    for seed in range(args.seeds):
        gen = torch.Generator().manual_seed(seed)
        rows["mi_dataset (pool M, 10 z each)"].append(float(mutual_information(mu, logvar, gen, samples=10)))
        rows["pool M, 1 z each"].append(float(mutual_information(mu, logvar, gen)))
        per_batch = sum(min(b, m - s) * float(mutual_information(mu[s : s + b], logvar[s : s + b], gen)) for s in range(0, m, b))
        rows[f"mi (pool of each batch of {b}, 1 z)"].append(per_batch / m)
    print(f"identical posteriors N(0, I): M = {m} texts, Z = {nz}, {args.seeds} evaluation seeds; true MI 0")
    for name, values in rows.items():
        t = torch.tensor(values)
        print(f"{name:40s} mean {t.mean():+.4f}  s.d. {t.std():.4f}  max |value| {t.abs().max():.4f}")
    for samples in (1, 10):
        print(f"closed-form s.d., pool M, {samples:2d} z each: sqrt(Z/2)/sqrt(M*S) = {math.sqrt(nz / 2 / (m * samples)):.4f}")


# ---------------------------------------------------------------- feature space
# The paper's Figure 2 (Long et al. §4.2-4.3): encoder feature space of 3-unit-encoder / 3-d-latent
# SeqVAEs on the validation set, for the last-state encoder, the last-state encoder with the cosine
# regulariser, and the max-pooled encoder; one 3-D scatter per model with the mean pairwise cosine
# of its features in the title, plus all three side by side (same axes, centred on 0).
#
#     python scripts/studies.py feature-space                       # demo corpus, 5 epochs: a few minutes on CPU
#     python scripts/studies.py feature-space --dataset yahoo10k    # yahoo10k, 20 epochs
#     python scripts/studies.py feature-space --dataset yahoo10k --epochs 104 --warmup-epochs 96 \
#         --init pytorch --tag long_pytorch                         # issue 50's long warm-up, PyTorch's init
#     python scripts/studies.py feature-space --out DIR --epochs N --config EXTRA.yaml …
#
# The models are trained as a `seqvae sweep` grid (resumable; run directories that finished are
# loaded, not retrained) under `--root` (default runs/feature_space/<dataset>[_<tag>]), with
# configs/yahoo10k/{last,cosine,max}.yaml on top of the dataset's base config and a 3-d z. yahoo10k:
# a 3-unit encoder LSTM (`model.encoder_hidden_dim`) and the base config's decoder, as the paper
# states (only the encoder is 3 units). demo: `model.hidden_dim` 3, the encoder's and the decoder's,
# as its committed figures were made. `--warmup-epochs N` sets the KL warm-up's length and the plateau
# rule's first epoch; `--init` the weights' initialisation (default: the config's). Features are the
# encoder's pooled LSTM states h (what the cosine regulariser and `feature_cos` see), computed by
# `model.encoder.features` in eval mode. PNGs go to docs/figures/feature_space/ (or `--out`), named
# <dataset>[_<tag>]_<variant>.png, <dataset>[_<tag>].png (side by side) and <dataset>[_<tag>]_kl.png
# (the paper's Figure 3: validation KL against updates, one line per model, from each run's events).

DATASETS = {  # `size`: the overrides that make the 3-unit encoder (see above)
    "demo": {"configs": ["configs/demo.yaml"], "epochs": 5, "size": {"model.hidden_dim": 3}},
    "yahoo10k": {"configs": ["configs/yahoo10k/base.yaml"], "epochs": 20, "size": {"model.encoder_hidden_dim": 3}},
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


def feature_space_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Figure 2: 3-D encoder feature spaces (last, cosine, max).")
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="demo")
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="extra config on top (repeatable)")
    parser.add_argument("--epochs", type=int, help="trainer.max_epochs (default: demo 5, yahoo10k 20)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup-epochs", type=float, help="KL warm-up length in epochs (and the plateau rule's first epoch)")
    parser.add_argument("--init", choices=("reference", "pytorch"), help="model.init (default: the config's)")
    parser.add_argument("--tag", default="", help="names the runs' root and the PNGs: <dataset>_<tag>")
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
    name = f"{args.dataset}_{args.tag}" if args.tag else args.dataset
    schedule = {}
    if args.warmup_epochs is not None:
        # plateau.min_epochs is an int option (the CLI refuses 96.0): the first whole epoch at or after the warm-up's end
        first = math.ceil(args.warmup_epochs)
        schedule = {"model.kl_schedule.init_args.warmup_epochs": args.warmup_epochs, "plateau.min_epochs": first}
    grid = {
        "root": args.root or f"runs/feature_space/{name}",
        "configs": dataset["configs"] + args.config,
        "overrides": {
            **dataset["size"],
            **schedule,
            **({"model.init": args.init} if args.init else {}),
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
        png = args.out / f"{name}_{variant}.png"
        fig.savefig(png, dpi=100)
        print(f"{variant}: mean pairwise cosine {cos:.4f} over {len(h)} texts -> {png}")
    if len(panels) > 1:
        fig = Figure(figsize=(5 * len(panels), 5.4))
        for i, (_, h, title, _) in enumerate(panels):
            scatter(fig.add_subplot(1, len(panels), i + 1, projection="3d"), h, title, args.max_points, lim)
        fig.subplots_adjust(left=0.01, right=0.97, bottom=0.03, top=0.9, wspace=0.08)
        fig.savefig(args.out / f"{name}.png", dpi=100)
        print(f"all: {args.out / f'{name}.png'}")
    if done:
        kl_figure(done, args.out / f"{name}_kl.png", Figure)
    return 1 if failed else 0


def kl_figure(cells, png: Path, Figure) -> None:
    """The paper's Figure 3: validation KL against updates, one line per model (from each run's events)."""
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for cell in cells:
        with tempfile.TemporaryDirectory() as tmp:
            write_curves(cell.run_dir, Path(tmp) / "curves.csv")
            with (Path(tmp) / "curves.csv").open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if r.get("val/kl", "") != ""]
        updates = [int(float(r["step"])) + 1 for r in rows]  # a validation logs before its epoch's last update counts
        kl = [float(r["val/kl"]) for r in rows]
        ax.plot(updates, kl, label=VARIANTS[cell.variant][1])
        last = f"validation KL {kl[-1]:.3f} at {updates[-1]} updates" if kl else "no validation KL"
        print(f"{cell.variant}: {last}")
    ax.set(xlabel="updates", ylabel="validation KL (nats)", title="KL on the validation set, 3-d z")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    print(f"kl: {png}")


def long_warmup_main(argv: list[str]) -> int:
    """Feature cosine and KL against updates, long against 10-epoch KL warm-up (scripts/long_warmup.py's docstring)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import long_warmup

    return long_warmup.main(argv)


STUDIES = {"precision": precision_main, "mi-noise": mi_noise_main, "feature-space": feature_space_main,
           "long-warmup-updates": long_warmup_main}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in STUDIES:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    study = STUDIES[argv[0]]
    if study is mi_noise_main:  # reads sys.argv itself
        sys.argv = [f"studies.py {argv[0]}", *argv[1:]]
        study()
        return 0
    return study(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
