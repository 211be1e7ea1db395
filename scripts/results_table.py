"""Markdown table of exported runs, in the layout of the pooling paper's Table 1.

    python scripts/results_table.py docs/results/yahoo10k/*/seed*

Each directory holds metrics.json and config.yaml (as scripts/export_run.py writes them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = [
    ("IW-NLL", "test/iw_nll", "{:.2f}"),
    ("−ELBO", "test/loss", "{:.2f}"),
    ("KL", "test/kl", "{:.2f}"),
    ("MI", "test/mi", "{:.2f}"),
    ("MI (dataset)", "test/mi_dataset", "{:.2f}"),
    ("AU", "test/au", "{:.0f}"),
    ("feature cos", "test/feature_cos", "{:.4f}"),
    ("IW PPL", "test/iw_ppl", "{:.1f}"),
    ("enc / dec updates", None, None),
    ("epochs", "epochs", "{}"),
    ("train time (min)", "fit_seconds", None),
]


def row(run: Path) -> list[str]:
    m = json.loads((run / "metrics.json").read_text())
    cells = [f"{run.parent.name} ({run.name})"]
    for _, key, fmt in COLUMNS:
        if key is None:
            cells.append(f"{m.get('encoder_updates', '–')} / {m.get('decoder_updates', '–')}")
        elif key == "fit_seconds":
            cells.append(f"{m[key] / 60:.1f}")
        else:
            cells.append(fmt.format(m[key]) if key in m else "–")
    return cells


def main(dirs: list[str]) -> None:
    print("| run | " + " | ".join(c[0] for c in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for d in dirs:
        if (Path(d) / "metrics.json").exists():
            print("| " + " | ".join(row(Path(d))) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
