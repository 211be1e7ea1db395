"""`seqvae export RUN_DIR DEST_DIR`: copy a finished run's small result files — config.yaml, its
per-text results, metrics.json (last: it marks the set complete) and the per-epoch validation
curves (curves.csv, read from the TensorBoard event files) — e.g. into the repository's
docs/results/. Checkpoints and event files never leave the run directory. `seqvae sweep` exports
each finished cell the same way (`export:` in its grid file).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from seqvae.rundir.curves import write_curves
from seqvae.store.files import CONFIG, CURVES, METRICS


def result_files(run_dir: Path) -> list[str]:
    """A finished run's small result files, in copy order: config.yaml, curves.csv, its per-text
    results (the file metrics.json names) and metrics.json last (it marks the set complete)."""
    names = [CONFIG, CURVES]
    try:
        per_text = json.loads((run_dir / METRICS).read_text()).get("per_text_file")
    except (OSError, json.JSONDecodeError):
        per_text = None
    if per_text and Path(per_text).name == per_text:
        names.append(per_text)
    return [*names, METRICS]


def export_run(run: Path, dest: Path) -> int:
    """Copies the run's result files to dest; returns the number of validation points in curves.csv."""
    dest.mkdir(parents=True, exist_ok=True)
    points = write_curves(run, dest / CURVES)
    for name in result_files(run):
        if name != CURVES and (run / name).exists():
            shutil.copy2(run / name, dest / name)
    return points


def refusal(run: Path, dest: Path) -> str | None:
    """Why `export RUN DEST` must not run, checked before anything is written; None if it may.
    Before: DEST = RUN rewrote the run's curves.csv, then raised SameFileError; a DEST that was an
    unfinished run (checkpoints, no metrics.json yet) had its config.yaml, which its resume checks,
    replaced by another run's; a metrics.json that is not a JSON object was copied, or failed
    after curves.csv was written."""
    if not run.is_dir():
        return f"{run}: no such run directory"
    if not (run / METRICS).is_file():
        return f"{run}: not a finished run (no metrics.json)"
    try:
        metrics = json.loads((run / METRICS).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{run / METRICS}: not readable JSON ({' '.join(str(err).split())})"
    if not isinstance(metrics, dict):
        return f"{run / METRICS}: not a JSON object of metrics"
    if dest.exists() and dest.resolve() == run.resolve():
        return f"{dest}: is the run directory itself; export to another directory"
    if (dest / "checkpoints").exists() or any(dest.glob("events.out.tfevents.*")):
        return f"{dest}: is a run directory (checkpoints or event files): export elsewhere"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqvae export", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("run", type=Path, help="run directory (config.yaml, metrics.json, event files)")
    p.add_argument("dest", type=Path, help="where the small files go, e.g. docs/results/<grid>/<variant>/seed<N>")
    args = p.parse_args(argv)
    refused = refusal(args.run, args.dest)
    if refused is not None:
        print(f"seqvae export: error: {refused}", file=sys.stderr)
        return 2
    blocking = next((p for p in (args.dest, *args.dest.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        print(f"seqvae export: error: {args.dest}: {blocking} is a file, not a directory", file=sys.stderr)
        return 2
    held = args.dest / METRICS
    if held.is_file() and held.read_bytes() != (args.run / METRICS).read_bytes():
        # Results already written are not replaced without a word: they may be committed ones.
        print(f"seqvae export: error: {args.dest} holds another run's results: remove them or export elsewhere", file=sys.stderr)
        return 2
    points = export_run(args.run, args.dest)
    print(f"exported {args.run} -> {args.dest} ({points} validation points)")
    return 0
