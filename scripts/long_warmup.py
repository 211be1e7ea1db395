"""Validation feature cosine and KL against UPDATES: the long-KL-warm-up grid beside the 10-epoch-warm-up runs
(issue 50, as the paper's Figures 4-5 draw them).

    python scripts/studies.py long-warmup-updates [--out docs/figures] [--table docs/results/long_warmup_updates.md]

Reads, per pooling, the committed curves of docs/results/yahoo10k_long_warmup/<pooling>/seed*/ (curves.csv, or
curves_partial.csv where a run did not finish) and of the 10-epoch-warm-up runs of the same network (yahoo10k
base: emb 64, encoder LSTM 128, z 32, He et al.'s init, 20 epochs): `last` = yahoo10k_recipe20/last (seeds 1-3),
`max` = yahoo10k_encoder_width/max_encoder128 (seeds 1-2). No 20-epoch 10-epoch-warm-up run of `avg` or `abs` is
committed (the 6-epoch short grids warm up over 3 epochs), so those poolings have long-warm-up curves only.
Missing cells are skipped with a note on stderr. Writes docs/figures/long_warmup_<pooling>.png (one figure per
pooling: feature cosine and KL, seeds overlaid, long against 10-epoch warm-up) and a table of the seed means at
matched update counts.

Updates: curves.csv's `step` is Lightning's count of batches on which the optimiser stepped (every batch here:
no gradient accumulation), logged by the validation at an epoch's end BEFORE that epoch's last update is counted,
so the updates made by a validation point are step + 1 (334 batches per yahoo10k epoch: steps 333, 667, ...).
A table column at N updates takes each run's first validation at >= N updates ('–' when the run has none).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LONG = "docs/results/yahoo10k_long_warmup"
# the 10-epoch-warm-up runs with the long grid's network (encoder LSTM 128, He et al.'s init), by pooling
TEN_EPOCH = {"last": "docs/results/yahoo10k_recipe20/last", "max": "docs/results/yahoo10k_encoder_width/max_encoder128"}
POOLINGS = ("last", "max", "avg", "abs")
UPDATES = (1000, 3000, 10000, 32000)  # 32000: about where the long warm-up (32,064 updates) reaches weight 1
METRICS = (("val/feature_cos", "feature cosine"), ("val/kl", "KL"))
CURVES = ("curves.csv", "curves_partial.csv")  # a finished run's, else what the lead committed of an unfinished one


def read_curve(seed_dir: Path) -> dict | None:
    """{'updates': [...], 'val/feature_cos': [...], 'val/kl': [...], 'warmup': updates until weight 1 or None,
    'partial': bool} of one run, or None when it has no curves file."""
    path = next((seed_dir / name for name in CURVES if (seed_dir / name).is_file()), None)
    if path is None:
        return None
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/kl", "") != ""]
    curve = {"updates": [int(float(r["step"])) + 1 for r in rows], "partial": path.name != CURVES[0]}
    for key, _ in METRICS:
        curve[key] = [float(r[key]) if r.get(key, "") != "" else float("nan") for r in rows]
    curve["warmup"] = None
    config = seed_dir / "config.yaml"
    if config.is_file() and curve["updates"]:
        schedule = (yaml.safe_load(config.read_text()).get("model") or {}).get("kl_schedule") or {}
        epochs = (schedule.get("init_args") or {}).get("warmup_epochs")
        if epochs is not None:  # the first validation's updates are one epoch's batches
            curve["warmup"] = round(float(epochs) * curve["updates"][0])
    return curve


def runs(root: Path, folder: str, note) -> dict[str, dict]:
    """seed name -> curve of every seed*/ under root/folder; notes the folders without curves."""
    found = {}
    if not (root / folder).is_dir():
        note(f"{folder}: not there: skipped")
        return found
    for seed_dir in sorted((root / folder).glob("seed*")):
        curve = read_curve(seed_dir)
        if curve is None:
            note(f"{folder}/{seed_dir.name}: no {' or '.join(CURVES)}: skipped")
        elif not curve["updates"]:
            note(f"{folder}/{seed_dir.name}: no validation rows: skipped")
        else:
            found[seed_dir.name] = curve
    return found


def value_at(curve: dict, key: str, updates: int | None) -> float | None:
    """key at the run's first validation with >= updates (None: the last one); None when it has none."""
    if updates is None:
        return curve[key][-1]
    return next((v for u, v in zip(curve["updates"], curve[key]) if u >= updates), None)


def fmt(values: list[float | None]) -> str:
    have = [v for v in values if v is not None]
    if not have:
        return "–"
    mean = statistics.fmean(have)
    return f"{mean:.3f}" + (f" ({len(have)}/{len(values)})" if len(have) < len(values) else "")


def table(groups: dict[tuple[str, str], dict[str, dict]]) -> str:
    """Markdown: per pooling and warm-up, seed means of cosine and KL at UPDATES and at the end."""
    head = [f"{key.split('/')[1]} @ {u // 1000}k" for u in UPDATES for key, _ in METRICS]
    head += ["cos end", "KL end", "updates at end"]
    lines = ["| pooling | warm-up | seeds | KL weight 1 from | " + " | ".join(head) + " |", "|" + "---|" * (len(head) + 4)]
    for (pooling, regime), curves in groups.items():
        seeds = ", ".join(s.removeprefix("seed") + ("(partial)" if c["partial"] else "") for s, c in curves.items())
        cells = [fmt([value_at(c, key, u) for c in curves.values()]) for u in UPDATES for key, _ in METRICS]
        cells += [fmt([value_at(c, key, None) for c in curves.values()]) for key, _ in METRICS]
        cells.append(", ".join(str(c["updates"][-1]) for c in curves.values()))
        ends = sorted({c["warmup"] for c in curves.values() if c["warmup"]})
        weight_one = ", ".join(str(e) for e in ends) or "?"  # ? : no config.yaml beside the curves
        lines.append(f"| {pooling} | {regime} | {seeds} | {weight_one} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Seed means of validation feature cosine and KL at each run's first validation at or after N updates "
                 "(`step` + 1 of curves.csv); (k/n): only k of the n seeds had reached N; –: none had. KL weight 1 from: "
                 "the update at which the warm-up (0.1 -> 1) ends, warmup_epochs of the run's config.yaml x its batches "
                 "per epoch.")
    return "\n".join(lines) + "\n"


def draw(pooling: str, regimes: dict[str, dict[str, dict]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colours = {"long": "tab:blue", "10-epoch": "tab:orange"}
    for ax, (key, name) in zip(axes, METRICS):
        for regime, curves in regimes.items():
            for i, c in enumerate(curves.values()):
                label = f"{regime} warm-up" if i == 0 else None
                ax.plot(c["updates"], c[key], color=colours[regime], alpha=0.8, lw=1.2, label=label,
                        ls="--" if c["partial"] else "-")
            ends = {c["warmup"] for c in curves.values() if c["warmup"]}
            for end in ends:  # where the KL weight reaches 1
                ax.axvline(end, color=colours[regime], ls=":", lw=1)
        ax.set_xscale("log")
        ticks = [t for t in (300, 1000, 3000, 10000, 30000, 100000) if t <= 1.5 * ax.get_xlim()[1]]
        ax.set_xticks(ticks, [f"{t // 1000}k" if t >= 1000 else str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("updates (log scale; dotted: KL weight reaches 1)")
        ax.set_ylabel(f"validation {name}")
        ax.legend(fontsize=8)
    fig.suptitle(f"yahoo10k, {pooling} pooling: seeds overlaid (dashed: an unfinished run's curves_partial.csv)")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"long_warmup_{pooling}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def collect(root: Path, note) -> dict[tuple[str, str], dict[str, dict]]:
    groups = {}
    for pooling in POOLINGS:
        long_ = runs(root, f"{LONG}/{pooling}", note)
        if long_:
            groups[(pooling, "long")] = long_
        if pooling not in TEN_EPOCH:
            continue
        ten = runs(root, TEN_EPOCH[pooling], note)
        if ten:
            groups[(pooling, "10-epoch")] = ten
    return groups


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="studies.py long-warmup-updates", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures"), help="folder of the figures")
    parser.add_argument("--table", type=Path, default=Path("docs/results/long_warmup_updates.md"),
                        help="the table's file (also printed)")
    parser.add_argument("--no-plots", action="store_true", help="the table only")
    args = parser.parse_args(argv)
    groups = collect(root, lambda line: print(f"note: {line}", file=sys.stderr))
    if not groups:
        print("no curves found: nothing written", file=sys.stderr)
        return 1
    text = ("<!-- generated by python scripts/studies.py long-warmup-updates; do not edit -->\n"
            "# Feature cosine and KL at matched update counts (yahoo10k, long against 10-epoch KL warm-up)\n\n"
            + table(groups))
    (root / args.table).parent.mkdir(parents=True, exist_ok=True)
    (root / args.table).write_text(text, encoding="utf-8")
    print(text)
    if not args.no_plots:
        for pooling in dict.fromkeys(p for p, _ in groups):
            regimes = {r: c for (p, r), c in groups.items() if p == pooling}
            print(f"wrote {draw(pooling, regimes, root / args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
