"""Per-epoch validation curves of exported runs (docs/results/.../curves.csv) as one PNG.

    python scripts/plot_curves.py OUT.png LABEL=DIR [LABEL=DIR ...]

Each DIR holds a curves.csv written by scripts/export_run.py. Needs matplotlib
(`pip install -e ".[plots]"`).
"""

from __future__ import annotations

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = [
    ("val/kl", "KL (nats)"),
    ("val/au", "active units"),
    ("val/feature_cos", "feature cosine"),
    ("val/loss", "-ELBO (nats)"),
]


def read(path: str) -> dict[str, list[float]]:
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows if r[k] != ""] for k in rows[0]}


def main(out: str, runs: list[str]) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.2))
    for spec in runs:
        label, directory = spec.split("=", 1)
        curves = read(f"{directory}/curves.csv")
        epochs = [e + 1 for e in range(len(curves["val/loss"]))]
        for ax, (key, title) in zip(axes, PANELS):
            ax.plot(epochs, curves[key], marker="o", ms=3, label=label)
            ax.set_title(title)
            ax.set_xlabel("epoch")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
