"""`seqvae sweep GRID.yaml`: a grid of variants × seeds, each cell one `seqvae fit`, run one after another.

    seqvae sweep configs/sweeps/demo.yaml [--dry-run] [--compare] [--status] [--format markdown|csv|json] [--plots DIR]
                                          [--executor local|slurm|submitit-local] [--slurm.partition P ...]

The grid file (see configs/sweeps/):

    root: runs/sweeps/demo               # cell run directories: <root>/<variant>/seed<N>/
    configs: [configs/demo.yaml]         # base config files, for every cell
    overrides: {trainer.max_epochs: 3}   # optional dotted overrides, for every cell
    export: docs/results/demo            # optional: finished cells' config.yaml, metrics.json,
                                         #   per_text.csv and curves.csv are copied to <export>/<variant>/seed<N>/
    seeds: [1, 2]                        # seed_everything of each cell
    variants:                            # one row of the grid each
      - name: last                       # its directory name
        configs: []                      # optional extra config files, after the base ones
        overrides: {model.pooling: last} # optional; win over the common overrides
        needs: []                        # optional: variants whose cell of the same seed must finish first
        slurm: {gpus_per_node: 4}        # optional; wins over the grid's slurm
    slurm: {partition: gpu}              # optional: resources of --executor slurm (seqvae/executors.py)

Override values may use `${seed}`, `${variant}` and `${root}`. Cells run seed by seed, in the order
of `variants` (seed 1 of every variant, then seed 2, …), each as its own subprocess, so a crash
stops only that cell. Rerunning the same command skips cells with metrics.json (refusing one that
ran with other arguments than the grid now gives it, `check_finished_cells`), resumes cells with
checkpoints/last.ckpt from it, and starts the others (the leftovers of a start that failed before
its first checkpoint move to `<root>/<variant>/failed-seed<N>`). On a fresh machine (a new clone,
no run directories) a cell whose results are already in `export` counts as done and is skipped,
so a grid spread over sessions resumes from the committed results; only a cell that another
unfinished cell `needs` (its checkpoint is an input) is run again. `--no-export` ignores `export`
(reproducing committed results: every cell runs into `root`, nothing is copied over them). Each cell's output goes to
`sweep.log` in its run directory; finished cells get a curves.csv (validation curves from the event
files) for `seqvae compare --plots`. At the end the compare table of the finished cells is printed.
`--executor slurm` submits each cell as a submitit job instead, `submitit-local` as a local
submitit job (seqvae/executors.py); skipping, resuming, `needs`, export and the table stay the
same. `--status` prints each cell's state, epoch, last metric and job (sweep.job, sweep.run).
Ctrl-C or `kill PID` of the sweep stops its cells cleanly (SIGINT; each keeps its last
checkpoint and shows as interrupted in `--status`), never leaving them running orphaned.
Exit status: 0 when every cell finished, 1 when one failed or was blocked, 2 for a bad grid file,
130 when interrupted.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

import yaml

from seqvae.analysis import compare
from seqvae.experiments import executors
from seqvae.rundir.export import result_files
from seqvae.experiments.grid import Cell, GridError, load_grid, select  # noqa: F401  (load_grid: part of this module's API)
from seqvae.clock import clock

POLL_SECONDS = 2.0
TAIL_LINES = 20


# ------------------------------------------------------------------------------------- running
def say(text: str) -> None:
    print(f"seqvae sweep: {text}", file=sys.stderr, flush=True)


def command_line(cell: Cell) -> str:
    return "seqvae fit " + shlex.join(cell.fit_args())


def fit_command(args: list[str]) -> list[str]:
    # The interpreter running the sweep, so the cells see the same environment and package.
    # `-m`, not `-c`: Lightning's DDP launcher restarts sys.argv for the other ranks.
    return [sys.executable, "-m", "seqvae.cli", "fit", *args]


def move_aside(cell: Cell) -> Path:
    n, target = 1, cell.run_dir.with_name(f"failed-seed{cell.seed}")
    while target.exists():
        n += 1
        target = cell.run_dir.with_name(f"failed-seed{cell.seed}-{n}")
    cell.run_dir.rename(target)
    return target


def checkpoint_position(path: Path, of: int | None) -> str | None:
    """Where `last.ckpt` was saved: "epoch 3/20" at an epoch end, "epoch 4/20, batch 120" mid-epoch
    (PeriodicCheckpoint); None while it is being written."""
    try:
        import torch

        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # data, never code
        epoch = f"epoch {int(ckpt['epoch']) + 1}{f'/{of}' if of else ''}"
        batches = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
        if batches and not batches.get("is_last_batch", True):
            return f"{epoch}, batch {batches['current']['processed']}"
        return epoch
    except Exception:  # noqa: BLE001 - a half-written file; the next poll reads it
        return None


def max_epochs(run_dir: Path) -> int | None:
    try:
        return (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("trainer", {}).get("max_epochs")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


# The cells' processes while they run, and whether the sweep was interrupted: an interruption
# reaches the main thread only (KeyboardInterrupt, or SIGTERM turned into one), which passes it on
# to the cells (LocalRunner.stop); the threads that follow them then record "interrupted".
_LIVE: set[subprocess.Popen] = set()
_STOPPING = threading.Event()
GRACE_SECONDS = 10  # for a cell to stop on the SIGINT a terminal's Ctrl-C already sent it
STOP_SECONDS = 120  # for a cell to stop after the SIGINT the sweep sends; then it is killed


def run_cell(cell: Cell, one_thread: bool = False) -> tuple[int, list[str]]:
    """Runs one `seqvae fit`; its output goes to sweep.log. Returns (exit status, stderr tail).
    `one_thread`: cells run side by side, so each gets one torch thread unless OMP_NUM_THREADS
    says otherwise (several multi-threaded runs on the same cores stall each other)."""
    cell.run_dir.mkdir(parents=True, exist_ok=True)
    args = cell.fit_args()
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if one_thread:
        env.setdefault("OMP_NUM_THREADS", "1")
    start = time.monotonic()
    with open(cell.run_dir / "sweep.log", "a", encoding="utf-8") as log:
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {command_line(cell)}\n")
        log.flush()
        proc = subprocess.Popen(
            fit_command(args), stdout=log, stderr=subprocess.PIPE, env=env, encoding="utf-8", errors="replace"
        )
        _LIVE.add(proc)
        info = {"executor": "local", "job_id": str(proc.pid), "host": executors.socket.gethostname()}
        executors.write_json(cell.run_dir / executors.JOB_FILE, {**info, "pid_start": executors.proc_start(proc.pid)})
        executors.mark_started(cell.run_dir, str(proc.pid), proc.pid, cell.args)

        def read_stderr():
            for line in proc.stderr:
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        seen = cell.last_ckpt.stat().st_mtime if cell.last_ckpt.exists() else None
        try:
            while True:
                try:
                    proc.wait(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    pass
                mtime = cell.last_ckpt.stat().st_mtime if cell.last_ckpt.exists() else None
                if mtime is not None and mtime != seen:
                    where = checkpoint_position(cell.last_ckpt, max_epochs(cell.run_dir))
                    if where is not None:
                        seen = mtime
                        say(f"{cell.tag}: {where} saved, {clock(time.monotonic() - start)} elapsed")
        except KeyboardInterrupt:
            # Only where run_cell runs on the main thread (a direct call): the sweep runs cells in
            # pool threads, and LocalRunner.stop stops them. A fit that missed the SIGINT gets one.
            stop_processes([proc])
            executors.mark_ended(cell.run_dir, "interrupted")  # --status: resumable, not failed
            raise
        finally:
            reader.join(timeout=10)
            _LIVE.discard(proc)
    # --status: a cell stopped by the sweep's interruption is resumable, not failed
    executors.mark_ended(cell.run_dir, "interrupted" if _STOPPING.is_set() else proc.returncode)
    return proc.returncode, list(tail)


class LocalRunner:
    """Cells as subprocesses of the sweep (`--executor local`): the interface of executors.SubmititRunner."""

    def run(self, cell: Cell, one_thread: bool = False) -> tuple[int | None, list[str]]:
        return run_cell(cell, one_thread)

    def live(self, cell: Cell):
        return None  # a local cell lives only as long as the sweep that runs it

    def stop(self) -> None:
        """The sweep was interrupted: each cell gets SIGINT (unless it already stopped on the one
        a terminal sends the whole process group), Lightning's clean stop; its last checkpoint
        stays, so rerunning the sweep resumes it. A cell that does not stop is killed."""
        _STOPPING.set()
        stop_processes(list(_LIVE))


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Waits GRACE_SECONDS for each fit to stop on a SIGINT it may already have had (a
    terminal's Ctrl-C goes to the whole process group), then sends one, then kills a fit that
    is still running STOP_SECONDS later."""
    deadline = time.monotonic() + GRACE_SECONDS
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()


def write_curves(run_dir: Path) -> None:
    """curves.csv for `seqvae compare --plots`; kept when it is newer than metrics.json."""
    out = run_dir / "curves.csv"
    if out.exists() and out.stat().st_mtime >= (run_dir / "metrics.json").stat().st_mtime:
        return
    compare.write_curves(run_dir, out)


def export_cell(cell: Cell) -> bool:
    """Copies a finished cell's result files (`result_files`) to its export directory (small
    files, meant to be committed; checkpoints and event files stay in the run directory).
    Returns whether it copied (False: no export directory, or already there and up to date)."""
    if cell.export_dir is None:
        return False
    done = cell.export_dir / "metrics.json"
    if done.exists() and done.stat().st_mtime >= (cell.run_dir / "metrics.json").stat().st_mtime:
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


def run_grid(cells: list[Cell], jobs: int = 1, runner=None) -> list[Cell]:
    """Runs the cells that have not finished, in grid order, `jobs` at a time (a cell whose
    `needs` are still running waits for them), each through `runner` (LocalRunner, or
    executors.SubmititRunner: a cell whose job is still queued or running is followed, not
    submitted again). Returns the cells that failed or were blocked."""
    runner = runner or LocalRunner()
    start = time.monotonic()
    durations: list[float] = []
    failed: list[Cell] = []
    counts = collections.Counter()
    pending, running, settled = list(cells), {}, 0
    rerun = needed_again(cells)

    def skippable(cell):
        return cell.state() == "finished" or (cell.state() == "exported" and cell.run_dir not in rerun)

    def progress():
        left = sum(not skippable(c) for c in pending)
        todo = left + len(running)
        mean = sum(durations) / len(durations) if durations else None
        eta = "ETA 0:00" if not todo else f"ETA {clock(mean * todo / min(jobs, todo))}" if mean else "ETA ?"
        elapsed = clock(time.monotonic() - start)
        say(f"grid {settled}/{len(cells)} done, {len(running)} running, {left} left, {elapsed} elapsed, {eta}")

    def timed(cell, handle=None):
        t0 = time.monotonic()
        code, tail = runner.follow(cell, handle) if handle else runner.run(cell, one_thread=jobs > 1)
        return code, tail, time.monotonic() - t0, handle is None

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            while pending or running:
                for cell in list(pending):
                    if len(running) >= jobs:
                        break
                    if skippable(cell):
                        pending.remove(cell)
                        if cell.state() == "finished":
                            say(f"{cell.tag}: finished ({cell.run_dir / 'metrics.json'}), skipped")
                            finish(cell)  # a run finished by hand, or an export directory added later
                        else:
                            say(f"{cell.tag}: results exported earlier ({cell.export_dir / 'metrics.json'}), skipped")
                        counts["skipped"] += 1
                        settled += 1
                        progress()
                        continue
                    handle = runner.live(cell)
                    if handle is not None:  # submitted by an earlier sweep, still queued or running
                        pending.remove(cell)
                        say(f"{cell.tag}: job {handle.job_id} submitted earlier is {handle.state().lower()}: following it")
                        running[pool.submit(timed, cell, handle)] = cell
                        continue
                    unmet = [n for n in cell.needs if not (n / "metrics.json").is_file()]
                    if any(c.run_dir in unmet for c in [*running.values(), *pending[: pending.index(cell)]]):
                        continue  # what it needs may still finish
                    pending.remove(cell)
                    if unmet:
                        say(f"{cell.tag}: blocked: needs {', '.join(map(str, unmet))} finished first")
                        counts["blocked"] += 1
                        failed.append(cell)
                        settled += 1
                        progress()
                        continue
                    if cell.state() == "interrupted":
                        say(f"{cell.tag}: resuming from {cell.last_ckpt}")
                    elif cell.state() == "exported":
                        again = f"but a later cell needs its checkpoint: starting again in {cell.run_dir}"
                        say(f"{cell.tag}: exported earlier, {again}")
                    else:
                        if cell.run_dir.exists() and any(cell.run_dir.iterdir()):
                            say(f"{cell.tag}: moved the leftovers of a failed start to {move_aside(cell)}")
                        say(f"{cell.tag}: starting in {cell.run_dir}")
                    running[pool.submit(timed, cell)] = cell
                if not running:
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    cell = running.pop(future)
                    code, tail, took, whole = future.result()
                    settled += 1
                    if code == 0 and cell.state() == "finished":
                        if whole:  # not a job followed from its middle
                            durations.append(took)
                        counts["ran"] += 1
                        say(f"{cell.tag}: done in {clock(took)}")
                        finish(cell)
                    else:
                        counts["failed"] += 1
                        failed.append(cell)
                        why = "job failed" if code is None else f"exit {code}" if code else "no metrics.json"
                        say(f"{cell.tag}: FAILED ({why}) after {clock(took)}; log {cell.run_dir / 'sweep.log'}; its tail:")
                        for line in tail:
                            print(f"    {line}", file=sys.stderr)
                    progress()
        except KeyboardInterrupt:
            runner.stop()  # the threads that follow jobs return
            raise
    summary = ", ".join(f"{n} {k}" for k, n in counts.items())
    say(f"{len(cells)} cells ({summary}) in {clock(time.monotonic() - start)}")
    if failed:
        say(f"not finished: {', '.join(c.name for c in sorted(failed, key=lambda c: c.index))}")
    return failed


def check_variants(cells: list[Cell]) -> None:
    """Each variant's `seqvae fit` arguments (one seed's: the seeds differ only in the seed),
    parsed as the CLI parses them before any cell runs: a typo in a grid's overrides stops the
    sweep in one line, instead of failing every cell of the variant in turn. Reads no data."""
    from seqvae.cli import parse_only  # torch and Lightning: only when cells are about to run

    checked = set()
    for cell in cells:  # finished cells too: their variant is what the grid file says now
        if cell.variant not in checked:
            checked.add(cell.variant)
            error = parse_only(cell.args)
            if error:
                raise GridError(f"variant {cell.variant}: {error}")


def check_finished_cells(cells: list[Cell]) -> None:
    """A finished cell is skipped, so its results must be those of the arguments the grid gives
    it now, and an interrupted one resumes, so its first part must have had them too: one that
    ran with others (the grid was edited since) stops the sweep instead of showing old results
    under the new settings, or mixing the two in one run. Nothing is moved or deleted."""
    stale = [(cell, cell.state(), cell.recorded_args()) for cell in cells]
    stale = [(c, state, ran) for c, state, ran in stale if state in ("finished", "interrupted") and ran not in (None, c.args)]
    if stale:
        cell, state, ran = stale[0]
        more = f" (and {len(stale) - 1} more cells)" if len(stale) > 1 else ""
        raise GridError(
            f"{cell.name} {'finished' if state == 'finished' else 'started'} with other arguments than the grid gives it "
            f"now{more}: {args_difference(ran, cell.args)}; move {cell.run_dir} aside to run it again, or restore the grid"
        )


def args_difference(ran: list[str], now: list[str]) -> str:
    """What differs between two `seqvae fit` argument lists, option by option."""
    pairs = lambda a: list(zip(a[0::2], a[1::2])) if len(a) % 2 == 0 else [(x, "") for x in a]  # noqa: E731
    old, new = pairs(ran), pairs(now)
    gone = [" ".join(p).strip() for p in old if p not in new]
    added = [" ".join(p).strip() for p in new if p not in old]
    if not gone and not added:
        return "the same options in another order"
    return f"ran with {', '.join(gone) or 'nothing else'}; the grid now gives {', '.join(added) or 'nothing else'}"


def dry_run(cells: list[Cell]) -> None:
    rerun = needed_again(cells)
    for cell in cells:
        state = cell.state()
        if state == "finished":
            print(f"# {cell.tag}: finished, skip ({cell.run_dir / 'metrics.json'})")
            continue
        if state == "exported" and cell.run_dir not in rerun:
            print(f"# {cell.tag}: exported earlier, skip ({cell.export_dir / 'metrics.json'})")
            continue
        action = "resume" if state == "interrupted" else "start"
        if state == "new" and cell.run_dir.exists() and any(cell.run_dir.iterdir()):
            action += " (after moving the leftovers of a failed start aside)"
        print(f"# {cell.tag}: {action}")
        print(command_line(cell))


def compare_cells(cells: list[Cell], fmt: str, plots: Path | None) -> int:
    # An exported cell's result files (config.yaml, metrics.json, curves.csv) are all compare reads.
    done = [str(c.run_dir if c.state() == "finished" else c.export_dir) for c in cells if c.state() in ("finished", "exported")]
    if not done:
        say("no finished cells to compare")
        return 1
    sys.stdout.flush()
    return compare.main([*done, "--format", fmt, *(["--plots", str(plots)] if plots else [])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seqvae sweep", description="Runs a grid of variants × seeds resumably, then compares.")
    parser.add_argument("grid", metavar="GRID.yaml", help="the grid file (see configs/sweeps/)")
    parser.add_argument("--dry-run", action="store_true", help="print what each cell would do and its command; run nothing")
    parser.add_argument("--compare", action="store_true", help="run nothing; print the compare table of the finished cells")
    parser.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown", help="of the compare table")
    parser.add_argument("--plots", type=Path, metavar="DIR", help="also write the compare plots (validation curves) into DIR")
    parser.add_argument("--variants", metavar="A,B", help="only these variants (comma-separated names)")
    parser.add_argument("--seeds", metavar="1,2", help="only these seeds")
    parser.add_argument(
        "--jobs", type=int, metavar="N", help="run N cells at a time (default 1, one thread each; slurm: every cell at once)"
    )
    parser.add_argument("--status", action="store_true", help="run nothing; print each cell's state, epoch, last metric and job")
    parser.add_argument(
        "--no-export",
        action="store_true",
        help="ignore the grid's `export`: rerun cells whose results are committed there, and copy nothing to it",
    )
    executors.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs: must be >= 1, got {args.jobs}")
    try:
        cells = select(load_grid(args.grid), args.variants, args.seeds)
        if args.no_export:  # reproduce committed results in run directories, leaving the committed files as they are
            cells = [dataclasses.replace(c, export_dir=None) for c in cells]
        overrides = executors.slurm_overrides(args)
    except GridError as err:
        print(f"seqvae sweep: error: {err}", file=sys.stderr)
        return 2
    if not (args.compare or args.status):
        try:
            check_variants(cells)
            check_finished_cells(cells)
        except GridError as err:
            print(f"seqvae sweep: error: {args.grid}: {err}", file=sys.stderr)
            return 2
    if args.dry_run:
        dry_run(cells)
        return 0
    if args.compare:
        return compare_cells(cells, args.format, args.plots)
    if args.status:
        print("\n".join(executors.status_table(cells)))
        return 0
    runner, jobs = LocalRunner(), args.jobs or 1
    if args.executor != "local":
        if args.executor == "slurm" and shutil.which("sbatch") is None:
            print(
                "seqvae sweep: error: --executor slurm: no sbatch on this machine (run it on a SLURM login node)", file=sys.stderr
            )
            return 2
        folder = cells[0].run_dir.parents[1] / ".submitit"  # submitit's pickles and logs: <root>/.submitit/<job id>_*
        runner = executors.SubmititRunner(args.executor, folder, overrides, fit_command, say)
        jobs = args.jobs or (len(cells) if args.executor == "slurm" else 1)

    def terminate(signum, frame):  # `kill PID` of the sweep: stop like Ctrl-C, not orphan the cells
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers may be set
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    # A sweep started with `&` from a script ignores SIGINT, and its fits would inherit that: the
    # SIGINT that stops them would be lost and each killed STOP_SECONDS later. A handler set here
    # is reset to the default in each fit, where Python turns SIGINT into KeyboardInterrupt.
    ignored_sigint = main_thread and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _STOPPING.clear()
    try:
        failed = run_grid(cells, max(1, jobs), runner)
    except KeyboardInterrupt:
        say(f"interrupted{'; submitted jobs go on' if args.executor == 'slurm' else ''}; rerun the same command to resume")
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if ignored_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = compare_cells(cells, args.format, args.plots)
    return 1 if failed or code else 0


if __name__ == "__main__":
    sys.exit(main())
