"""Copy a finished run's small result files into the repo: config.yaml, metrics.json and the
per-epoch validation curves (curves.csv, read from the TensorBoard event files).

    python scripts/export_run.py RUN_DIR DEST_DIR

Checkpoints and event files never leave the run directory.
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value}, over every event file of the run (a resumed run has several)."""
    out: dict[str, dict[int, float]] = {}
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def main(run_dir: str, dest: str) -> None:
    run, dst = Path(run_dir), Path(dest)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.yaml", "metrics.json"):
        if (run / name).exists():
            shutil.copy2(run / name, dst / name)
    scalars = read_scalars(run)
    val_tags = sorted(t for t in scalars if t.startswith("val/"))
    extra = [t for t in ("train/lr", "train/wall_seconds", "epoch") if t in scalars]
    steps = sorted(scalars.get("val/loss", {}))
    with open(dst / "curves.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *extra, *val_tags])
        for step in steps:
            writer.writerow([step, *(scalars[t].get(step, "") for t in extra + val_tags)])
    print(f"exported {run} -> {dst} ({len(steps)} validation points)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
