"""`seqvae sweep GRID --status`: each cell's state (done, running, queued, failed, interrupted, not
started), epoch, last metric and job, read from its run directory (`cells.py`) and, for a job, from
the machine or cluster that runs it (`executors.job_state`). Runs nothing, moves nothing.
"""

from __future__ import annotations

import collections
import signal

from seqvae.experiments.cells import checkpoint_summary, max_epochs, read_job, read_json, read_run
from seqvae.experiments.executors import job_state
from seqvae.experiments.grid import Cell
from seqvae.metric_spec import headline
from seqvae.store.files import METRICS


def cell_status(cell: Cell) -> dict:
    """One row of `--status`: state (done, running, queued, failed, interrupted, not started),
    epoch, last metric and job."""
    job, run = read_job(cell.run_dir), read_run(cell.run_dir)
    row = {"cell": cell.name, "state": "not started", "epoch": "", "metric": "", "job": ""}
    if job.get("job_id"):
        row["job"] = f"{job.get('executor')} {job['job_id']}"
    metrics = read_json(cell.run_dir / METRICS) or (read_json(cell.export_dir / METRICS) if cell.export_dir else {})
    if metrics:
        return _finished(cell, row, metrics)
    if cell.last_ckpt.is_file():
        row["epoch"], row["metric"] = checkpoint_summary(cell.last_ckpt, max_epochs(cell.run_dir))
    live = job_state(job)
    this_run = run.get("job_id") is not None and str(run.get("job_id")) == str(job.get("job_id"))
    if live == "UNKNOWN" and this_run and run.get("started") and "ended" not in run and "requeued" not in run:
        live = "RUNNING"
    elif live == "UNKNOWN" and job and (not this_run or "requeued" in run):
        live = "QUEUED"
    if live in ("RUNNING", "QUEUED"):
        row["state"] = live.lower()
        return row
    code = run.get("exit") if this_run or not job else None
    if isinstance(code, int) and code not in (0, 130, -signal.SIGINT):
        row["state"] = f"failed (exit {code})"
    elif cell.last_ckpt.is_file():
        row["state"] = "interrupted"
    elif job or (cell.run_dir.is_dir() and any(cell.run_dir.iterdir())):
        row["state"] = "failed"
    return row


def _finished(cell: Cell, row: dict, metrics: dict) -> dict:
    """The row of a cell with a metrics.json here or in its export directory."""
    config = cell.run_dir if (cell.run_dir / METRICS).is_file() else cell.export_dir
    of = max_epochs(config)
    row.update(state="done" if config == cell.run_dir else "done (exported)", epoch=f"{metrics.get('epochs', '?')}/{of or '?'}")
    shown = headline(metrics)
    row["metric"] = f"{shown[0]} {shown[1]:.3f}" if shown else ""
    return row


def status_table(cells: list[Cell]) -> list[str]:
    """The lines of `seqvae sweep GRID --status`: one row per cell, then the count of each state."""
    rows = [cell_status(c) for c in cells]
    head = {"cell": "cell", "state": "state", "epoch": "epoch", "metric": "last metric", "job": "job"}
    width = {k: max(len(r[k]) for r in [head, *rows]) for k in head}
    lines = ["  ".join(r[k].ljust(width[k]) for k in head).rstrip() for r in [head, *rows]]
    counts = collections.Counter(r["state"].split(" (")[0] for r in rows)
    return [*lines, f"{len(rows)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items())]
