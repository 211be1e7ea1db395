"""Running a sweep's cells (`run_grid`): in grid order, `jobs` at a time, through a runner
(`local.LocalRunner`, or `executors.SubmititRunner`). A finished cell is skipped, an exported one too
(unless a later cell needs its checkpoint), an interrupted one resumes, a new one starts (after the
leftovers of a failed start move aside), a cell whose `needs` did not finish is blocked; a cell that
finished gets its curves.csv and its export. One progress line after each cell, a summary at the end.
"""

from __future__ import annotations

import collections
import shutil
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

from seqvae.analysis import compare
from seqvae.clock import clock
from seqvae.experiments.cells import LOG_FILE, checkpoint_position, has_leftovers, max_epochs, run_warnings, say
from seqvae.experiments.grid import Cell
from seqvae.experiments.local import LocalRunner
from seqvae.rundir.export import result_files
from seqvae.store.files import CURVES, METRICS


# ------------------------------------------------------------------------------------- a cell's files
def move_aside(cell: Cell) -> Path:
    n, target = 1, cell.run_dir.with_name(f"failed-seed{cell.seed}")
    while target.exists():
        n += 1
        target = cell.run_dir.with_name(f"failed-seed{cell.seed}-{n}")
    cell.run_dir.rename(target)
    return target


def write_curves(run_dir: Path) -> None:
    """curves.csv for `seqvae compare --plots`; kept when it is newer than metrics.json."""
    out = run_dir / CURVES
    if out.exists() and out.stat().st_mtime >= (run_dir / METRICS).stat().st_mtime:
        return
    compare.write_curves(run_dir, out)


def export_cell(cell: Cell) -> bool:
    """Copies a finished cell's result files (`result_files`) to its export directory (small
    files, meant to be committed; checkpoints and event files stay in the run directory).
    Returns whether it copied (False: no export directory, or already there and up to date)."""
    if cell.export_dir is None:
        return False
    done = cell.export_dir / METRICS
    if done.exists() and done.stat().st_mtime >= (cell.run_dir / METRICS).stat().st_mtime:
        return False
    cell.export_dir.mkdir(parents=True, exist_ok=True)
    for name in result_files(cell.run_dir):
        if (cell.run_dir / name).exists():
            shutil.copy2(cell.run_dir / name, cell.export_dir / name)
    return True


def finish(cell: Cell) -> None:
    try:
        write_curves(cell.run_dir)
    except Exception as err:  # noqa: BLE001 - the table does not need the curves
        say(f"{cell.tag}: no curves.csv ({' '.join(str(err).split())})")
    if export_cell(cell):
        say(f"{cell.tag}: results copied to {cell.export_dir}")


def needed_again(cells: list[Cell]) -> set[Path]:
    """The run directories of exported cells that an unfinished cell needs: an exported cell's
    checkpoint went with the machine that ran it, and freebits loads the autoencoder's best.ckpt."""
    needed = {n for c in cells if c.state() not in ("finished", "exported") for n in c.needs}
    return {c.run_dir for c in cells if c.state() == "exported" and c.run_dir in needed}


# ------------------------------------------------------------------------------------- the grid
def run_grid(cells: list[Cell], jobs: int = 1, runner=None) -> list[Cell]:
    """Runs the cells that have not finished, in grid order, `jobs` at a time (a cell whose
    `needs` are still running waits for them), each through `runner` (LocalRunner, or
    executors.SubmititRunner: a cell whose job is still queued or running is followed, not
    submitted again). Returns the cells that failed or were blocked."""
    grid = GridRun(cells, jobs, runner or LocalRunner())
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            while grid.pending or grid.running:
                grid.launch(pool)
                if grid.running:
                    done, _ = wait(grid.running, return_when=FIRST_COMPLETED)
                    for future in done:
                        grid.settle(future)
        except KeyboardInterrupt:
            grid.runner.stop()  # the fits stop (a job is no longer followed): the threads that follow them return
            grid.interrupted = True
            for future in list(grid.running):  # each running cell's line says how it ended: stopped, or done meanwhile
                grid.settle(future)
            raise
    return grid.summary()


class GridRun:
    """One `run_grid`: the cells still pending, those running (their futures), and the counts."""

    def __init__(self, cells: list[Cell], jobs: int, runner):
        self.cells, self.jobs, self.runner = cells, jobs, runner
        self.start = time.monotonic()
        self.durations: list[float] = []  # of the cells run whole: the ETA
        self.failed: list[Cell] = []
        self.counts: collections.Counter = collections.Counter()
        self.pending, self.running = list(cells), {}
        self.rerun = needed_again(cells)
        self.interrupted = False  # the sweep was interrupted: the cells that end now were stopped
        self.warned: list[str] = []  # cells whose latest run printed warnings

    def skippable(self, cell: Cell) -> bool:
        return cell.state() == "finished" or (cell.state() == "exported" and cell.run_dir not in self.rerun)

    def progress(self) -> None:
        """Every cell counted once: done (ran, or finished earlier and skipped now or soon), failed,
        blocked, stopped, running or left."""
        left = sum(not self.skippable(c) for c in self.pending)
        todo = left + len(self.running)
        mean = sum(self.durations) / len(self.durations) if self.durations else None
        eta = "ETA 0:00" if not todo else f"ETA {clock(mean * todo / min(self.jobs, todo))}" if mean else "ETA ?"
        elapsed = clock(time.monotonic() - self.start)
        ended = [(self.counts[k], k) for k in ("failed", "blocked", "stopped") if self.counts[k]]
        done = len(self.cells) - todo - sum(n for n, _ in ended)
        counts = "".join(f", {n} {k}" for n, k in ended)
        say(f"grid {done}/{len(self.cells)} done{counts}, {len(self.running)} running, {left} left, {elapsed} elapsed, {eta}")

    def timed(self, cell: Cell, handle=None) -> tuple[int | None, list[str], float, bool]:
        """(exit status, lines that say why it failed, seconds, whether it ran whole); in a pool thread."""
        t0 = time.monotonic()
        code, tail = self.runner.follow(cell, handle) if handle else self.runner.run(cell, one_thread=self.jobs > 1)
        return code, tail, time.monotonic() - t0, handle is None

    def launch(self, pool: ThreadPoolExecutor) -> None:
        """Settles or starts the pending cells, in grid order, while fewer than `jobs` run."""
        for cell in list(self.pending):
            if len(self.running) >= self.jobs:
                break
            if self.skippable(cell):
                self.pending.remove(cell)
                self.skip(cell)
                continue
            handle = self.runner.live(cell)
            if handle is not None:  # submitted by an earlier sweep, still queued or running
                self.pending.remove(cell)
                say(f"{cell.tag}: job {handle.job_id} submitted earlier is {handle.state().lower()}: following it")
                self.running[pool.submit(self.timed, cell, handle)] = cell
                continue
            unmet = [n for n in cell.needs if not (n / METRICS).is_file()]
            if any(c.run_dir in unmet for c in [*self.running.values(), *self.pending[: self.pending.index(cell)]]):
                continue  # what it needs may still finish
            self.pending.remove(cell)
            if unmet:
                self.block(cell, unmet)
                continue
            self.announce(cell)
            self.running[pool.submit(self.timed, cell)] = cell

    def skip(self, cell: Cell) -> None:
        if cell.state() == "finished":
            say(f"{cell.tag}: finished ({cell.run_dir / METRICS}), skipped")
            finish(cell)  # a run finished by hand, or an export directory added later
        else:
            say(f"{cell.tag}: results exported earlier ({cell.export_dir / METRICS}), skipped")
        self.counts["skipped"] += 1
        self.progress()

    def block(self, cell: Cell, unmet: list[Path]) -> None:
        say(f"{cell.tag}: blocked: needs {', '.join(map(str, unmet))} finished first")
        self.counts["blocked"] += 1
        self.failed.append(cell)
        self.progress()

    def announce(self, cell: Cell) -> None:
        """The line of a cell about to run: resuming, starting again, or starting."""
        if cell.state() == "interrupted":
            say(f"{cell.tag}: resuming from {cell.last_ckpt}")
        elif cell.state() == "exported":
            again = f"but a later cell needs its checkpoint: starting again in {cell.run_dir}"
            say(f"{cell.tag}: exported earlier, {again}")
        else:
            if has_leftovers(cell.run_dir):
                say(f"{cell.tag}: moved the leftovers of a failed start to {move_aside(cell)}")
            say(f"{cell.tag}: starting in {cell.run_dir}")

    def settle(self, future: Future) -> None:
        """A cell's run ended: done (curves, export), stopped by the interruption, or FAILED with
        the tail of its output; then its warnings, if it printed any."""
        cell = self.running.pop(future)
        code, tail, took, whole = future.result()
        if code != 0 and self.interrupted and cell.state() != "finished":
            self.counts["stopped"] += 1
            if code is None and tail:  # a submitted job: it goes on
                say(f"{cell.tag}: {tail[-1]}")
            else:
                where = checkpoint_position(cell.last_ckpt, max_epochs(cell.run_dir)) if cell.last_ckpt.is_file() else None
                resumable = f"resumable from {where}" if where else "before its first checkpoint"
                say(f"{cell.tag}: stopped after {clock(took)}, {resumable}")
        elif code == 0 and cell.state() == "finished":
            if whole:  # not a job followed from its middle
                self.durations.append(took)
            self.counts["ran"] += 1
            say(f"{cell.tag}: done in {clock(took)}")
            finish(cell)
        else:
            self.counts["failed"] += 1
            self.failed.append(cell)
            why = "job failed" if code is None else f"exit {code}" if code else "no metrics.json"
            say(f"{cell.tag}: FAILED ({why}) after {clock(took)}; log {cell.run_dir / LOG_FILE}; its tail:", tail)
        self.warn(cell)
        self.progress()

    def warn(self, cell: Cell) -> None:
        """The warnings a cell's fit printed (data read from another corpus, a broken bound, …),
        which are otherwise only in its sweep.log."""
        warnings = run_warnings(cell.run_dir)
        if warnings:
            self.warned.append(f"{cell.name} ({len(warnings)})")
            say(
                f"{cell.tag}: {len(warnings)} warning{'s' if len(warnings) > 1 else ''} (in {cell.run_dir / LOG_FILE}):", warnings
            )

    def summary(self) -> list[Cell]:
        """The last lines (the counts; the cells not finished); returns those cells."""
        summary = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        say(f"{len(self.cells)} cells ({summary}) in {clock(time.monotonic() - self.start)}")
        if self.failed:
            say(f"not finished: {', '.join(c.name for c in sorted(self.failed, key=lambda c: c.index))}")
        if self.warned:
            say(f"warnings (printed above with their cells): {', '.join(self.warned)}")
        return self.failed
