"""curves.csv: a run's validation curves, read from its TensorBoard event files (`seqvae export`,
the end of a fit, a sweep's finished cell)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from seqvae.store.files import EVENTS_GLOB, atomic_write_text


def write_curves(run_dir: Path, out: Path) -> int:
    """Writes curves.csv (step, train/lr, epoch and every val/ scalar, one row per validation)
    from the run's TensorBoard event files (a resumed run has several); returns the row count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    for events in sorted(run_dir.glob(EVENTS_GLOB)):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    val_tags = sorted(t for t in scalars if t.startswith("val/"))
    extra = [t for t in ("train/lr", "train/wall_seconds", "epoch") if t in scalars]
    steps = sorted(scalars.get("val/loss", {}))
    buf = io.StringIO()
    writer = csv.writer(buf)  # csv's own \r\n line ends, as curves.csv always had
    writer.writerow(["step", *extra, *val_tags])
    for step in steps:
        writer.writerow([step, *(scalars[t].get(step, "") for t in extra + val_tags)])
    atomic_write_text(out, buf.getvalue())
    return len(steps)
