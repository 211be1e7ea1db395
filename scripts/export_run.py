"""Copy a finished run's small result files into the repo: config.yaml, metrics.json, its
per-text results (per_text.csv) and the per-epoch validation curves (curves.csv, read from the
TensorBoard event files).

    python scripts/export_run.py RUN_DIR DEST_DIR

Checkpoints and event files never leave the run directory.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from seqvae.compare import write_curves
from seqvae.sweep import result_files


def main(run_dir: str, dest: str) -> None:
    run, dst = Path(run_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    rows = write_curves(run, dst / "curves.csv")
    for name in result_files(run):  # metrics.json last
        if name != "curves.csv" and (run / name).exists():
            shutil.copy2(run / name, dst / name)
    print(f"exported {run} -> {dst} ({rows} validation points)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
