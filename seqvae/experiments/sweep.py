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
    slurm: {partition: gpu}              # optional: resources of --executor slurm (executors.py)

Override values may use `${seed}`, `${variant}` and `${root}`. Cells run seed by seed, in the order
of `variants` (seed 1 of every variant, then seed 2, …), each as its own subprocess, so a crash
stops only that cell. Rerunning the same command skips cells with metrics.json (refusing one that
ran with other arguments than the grid now gives it, `check_finished_cells`, or read a config
file edited since, `check_config_contents`), resumes cells with
checkpoints/last.ckpt from it, and starts the others (the leftovers of a start that failed before
its first checkpoint move to `<root>/<variant>/failed-seed<N>`). On a fresh machine (a new clone,
no run directories) a cell whose results are already in `export` counts as done and is skipped,
so a grid spread over sessions resumes from the committed results; only a cell that another
unfinished cell `needs` (its checkpoint is an input) is run again. `--no-export` ignores `export`
(reproducing committed results: every cell runs into `root`, nothing is copied over them). Each cell's output goes to
`sweep.log` in its run directory; finished cells get a curves.csv (validation curves from the event
files) for `seqvae compare --plots`. At the end the compare table of the finished cells is printed.
`--executor slurm` submits each cell as a submitit job instead, `submitit-local` as a local
submitit job (executors.py); skipping, resuming, `needs`, export and the table stay the
same. `--status` prints each cell's state, epoch, last metric and job (sweep.job, sweep.run).
Ctrl-C or `kill PID` of the sweep stops its cells cleanly (one SIGINT each, at once; each keeps its
last checkpoint and shows as interrupted in `--status`), and `kill -9` of it does too (the kernel
sends the SIGINT: `cells.dies_with_parent`), never leaving them running orphaned; a rerun refuses,
naming the pid, a cell whose previous fit still runs (`check_no_live_fits`).
Exit status: 0 when every cell finished, 1 when one failed or was blocked, 2 for a bad grid file,
130 when interrupted.

The modules of seqvae/experiments: grid.py (the grid file, its cells), cells.py (a cell's command,
state files and state; the shared constants), schedule.py (`run_grid`: order, needs, jobs at a time,
skip/resume, export), local.py (`--executor local`), executors.py (the submitit runner), status.py
(`--status`) and this one (the command line, checks, dry run and compare table).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re
import shutil
import signal
import sys
import threading
from pathlib import Path

import yaml

from seqvae.analysis import compare
from seqvae.experiments import executors
from seqvae.experiments.cells import (  # noqa: F401  (checkpoint_position, max_epochs: part of this module's API)
    STOP_SECONDS,
    checkpoint_position,
    command_line,
    config_digests,
    file_digest,
    fit_command,
    has_leftovers,
    max_epochs,
    pid_alive,
    read_job,
    read_run,
    recorded_configs,
    say,
)
from seqvae.experiments.grid import Cell, GridError, load_grid, select  # noqa: F401  (load_grid: part of this module's API)
from seqvae.experiments.local import LocalRunner
from seqvae.experiments.schedule import needed_again, run_grid
from seqvae.experiments.status import status_table


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
            if error:  # the grid file's key where the option named came from, if an override gave it
                key = next((k for k in cell.where if re.search(rf"(?<![\w.]){re.escape(k)}(?![\w.])", error)), None)
                raise GridError(
                    f"{cell.where[key]} (variant {cell.variant}): {error}" if key else f"variant {cell.variant}: {error}"
                )


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


def check_config_contents(cells: list[Cell]) -> None:
    """The same for the files: a finished or interrupted cell whose config files (a grid's or a
    variant's `configs`, and the files they name) were edited since it started stops the sweep, in
    one line naming the first such file and its cells. Cells recorded before the digests were kept
    (no "configs" in sweep.run) are not checked (`unchecked_cells`)."""
    changed: dict[str, list[tuple[Cell, str | None, str | None]]] = {}
    for cell in cells:
        ran = recorded_configs(cell.run_dir) if cell.state() in ("finished", "interrupted") else None
        now = config_digests(cell.args) if ran is not None else {}
        for name, digest in (ran or {}).items():
            if now.get(name, file_digest(Path(name))) != digest:
                changed.setdefault(name, []).append((cell, digest, now.get(name, file_digest(Path(name)))))
    if changed:
        name, hits = next(iter(changed.items()))
        _, then, now = hits[0]
        more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
        what = f"was edited (sha256 {(then or '?')[:12]} then, {now[:12]} now)" if now else "is gone"
        dirs = ", ".join(str(c.run_dir) for c, _, _ in hits)
        raise GridError(
            f"{name} {what} since {', '.join(c.name for c, _, _ in hits)} ran{more}; "
            f"move {dirs} aside to run {'it' if len(hits) == 1 else 'them'} again, or restore the file"
        )


def check_no_live_fits(cells: list[Cell], executor: str) -> None:
    """A cell whose previous fit still runs on this machine (a sweep killed before it could stop
    it, or another sweep of the same grid) is not started or resumed beside it: two processes would
    write one run directory. A job of `executor` still queued or running is followed instead
    (`SubmititRunner.live`), so it passes."""
    for cell in cells:
        run, job = read_run(cell.run_dir), read_job(cell.run_dir)
        if executor != "local" and job.get("executor") == executor:
            continue
        if run.get("pid") and "ended" not in run and pid_alive(run["pid"], run.get("pid_start"), run.get("host")):
            raise GridError(
                f"{cell.name}: its previous fit (pid {run['pid']}, started {run.get('started', '?')}) is still running in "
                f"{cell.run_dir}; wait for it to end or stop it (kill -INT {run['pid']}), then rerun"
            )


def unchecked_cells(cells: list[Cell]) -> list[Cell]:
    """Finished or interrupted cells whose sweep.run has no config digests (run by an older sweep)."""
    return [
        c
        for c in cells
        if c.state() in ("finished", "interrupted") and c.recorded_args() is not None and recorded_configs(c.run_dir) is None
    ]


def args_difference(ran: list[str], now: list[str]) -> str:
    """What differs between two `seqvae fit` argument lists, option by option."""
    pairs = lambda a: list(zip(a[0::2], a[1::2])) if len(a) % 2 == 0 else [(x, "") for x in a]  # noqa: E731
    old, new = pairs(ran), pairs(now)
    gone = [" ".join(p).strip() for p in old if p not in new]
    added = [" ".join(p).strip() for p in new if p not in old]
    if not gone and not added:
        return "the same options in another order"
    return f"ran with {', '.join(gone) or 'nothing else'}; the grid now gives {', '.join(added) or 'nothing else'}"


SPLITS = ("train", "val", "test")
SPLIT_LINES = re.compile(r"#\d+-\d+$")  # FILE#FIRST-LAST


def _config_splits(path: Path, depth: int = 0) -> dict:
    """The data splits a --config file sets, with those of the files its own `config:` key names
    (relative to it, as jsonargparse reads them; before its own keys, which win). {} for a file
    that cannot be read: the argument check names it."""
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(loaded, dict):
        return {}
    out: dict = {}
    nested = loaded.get("config")
    for inner in [nested] if isinstance(nested, str) else nested if isinstance(nested, list) else []:
        if depth < 8 and isinstance(inner, str):  # a file that names itself stops here
            out.update(_config_splits(path.parent / inner, depth + 1))
    data = loaded.get("data")
    out.update({k: v for k, v in data.items() if k in SPLITS} if isinstance(data, dict) else {})
    return out


def missing_data_files(args: list[str]) -> list[str]:
    """ "data.train: no such file F" for each split whose file, as the cell's `--config` files and
    flags set it (the last one wins), does not exist: what its fit would stop on. Reads no data."""
    values: dict[str, object] = {}
    for flag, value in zip(args[0::2], args[1::2]):
        if flag == "--config":
            values.update(_config_splits(Path(value)))
        elif flag.startswith("--data.") and flag[7:] in SPLITS:
            values[flag[7:]] = None if value == "null" else value
    # a ${…} interpolation resolves only when fit parses the merged config: not checked here (its fit still says so)
    files = {split: SPLIT_LINES.sub("", v) for split, v in values.items() if isinstance(v, str) and "${" not in v}
    return [f"data.{split}: no such file {f}" for split, f in files.items() if not Path(f).is_file()]


def check_data_files(cells: list[Cell]) -> None:
    """Before any cell starts: a cell that would run (not finished, not exported) and names a data
    file that does not exist stops the sweep in one line, instead of each such cell writing a
    run directory and failing in turn. Reads no data (an empty or unreadable file still fails its cell)."""
    to_run = [c for c in cells if c.state() not in ("finished", "exported")]
    for cell in to_run:
        missing = missing_data_files(cell.args)
        if missing:
            same = [c.name for c in to_run if c is not cell and missing_data_files(c.args) == missing]
            also = f" (also {', '.join(same)})" if same else ""
            raise GridError(f"{cell.name}: {'; '.join(missing)}{also}; no cell was started")


def dry_run(cells: list[Cell]) -> int:
    """Prints what each cell would do and its command; 1 when a cell that would run names a data
    file that does not exist (it would fail), else 0."""
    rerun = needed_again(cells)
    failing = []
    for cell in cells:
        state = cell.state()
        if state == "finished":
            print(f"# {cell.tag}: finished, skip ({cell.run_dir / 'metrics.json'})")
            continue
        if state == "exported" and cell.run_dir not in rerun:
            print(f"# {cell.tag}: exported earlier, skip ({cell.export_dir / 'metrics.json'})")
            continue
        action = "resume" if state == "interrupted" else "start"
        if state == "new" and has_leftovers(cell.run_dir):
            action += " (after moving the leftovers of a failed start aside)"
        missing = missing_data_files(cell.args)
        if missing:
            failing.append(cell.name)
            action += f", and it would fail: {'; '.join(missing)}"
        print(f"# {cell.tag}: {action}")
        print(command_line(cell.fit_args()))
    if failing:
        say(f"{len(failing)} cells would fail on a missing data file: {', '.join(failing)}")
    return 1 if failing else 0


def compare_cells(cells: list[Cell], fmt: str, plots: Path | None) -> int:
    # An exported cell's result files (config.yaml, metrics.json, curves.csv) are all compare reads.
    done = [str(c.run_dir if c.state() == "finished" else c.export_dir) for c in cells if c.state() in ("finished", "exported")]
    if not done:
        say("no finished cells to compare")
        return 1
    sys.stdout.flush()
    return compare.main([*done, "--format", fmt, *(["--plots", str(plots)] if plots else [])])


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
            check_config_contents(cells)
            check_no_live_fits(cells, args.executor)
            if not args.dry_run:  # the dry run lists every cell that would fail on a missing file
                check_data_files(cells)
        except GridError as err:
            print(f"seqvae sweep: error: {args.grid}: {err}", file=sys.stderr)
            return 2
        old = unchecked_cells(cells)
        if old:
            say(
                f"note: {', '.join(c.name for c in old)} ran before the sweep kept its config files' digests: their contents "
                "are not checked (a resumed cell's are from its resume on)"
            )
    if args.dry_run:
        return dry_run(cells)
    if args.compare:
        return compare_cells(cells, args.format, args.plots)
    if args.status:
        print("\n".join(status_table(cells)))
        return 0
    return run(cells, args, overrides)


def run(cells: list[Cell], args: argparse.Namespace, overrides: dict) -> int:
    """Runs the grid through the runner of `--executor`, then prints the compare table."""
    picked = runner_of(cells, args, overrides)
    if picked is None:
        return 2
    runner, jobs = picked
    try:
        with interruptible():
            failed = run_grid(cells, max(1, jobs), runner)
    except KeyboardInterrupt:
        left = [c.name for c in cells if c.state() not in ("finished", "exported")]
        if left:  # the cells' own lines said which stopped and which finished meanwhile
            jobs = "; submitted jobs go on" if args.executor == "slurm" else ""
            unfinished = f"{len(left)} of {len(cells)} cells not finished ({', '.join(left)})"
            say(f"interrupted: {unfinished}{jobs}; rerun the same command to resume")
            return 130
        say("interrupted after every cell had finished")
        failed = []
    code = compare_cells(cells, args.format, args.plots)
    return 1 if failed or code else 0


def runner_of(cells: list[Cell], args: argparse.Namespace, overrides: dict) -> tuple[object, int] | None:
    """(the runner of `--executor`, cells at a time); None after the error line when it cannot run here."""
    if args.executor == "local":
        # this module's fit_command and STOP_SECONDS, looked up at each run: a caller may set them here
        return LocalRunner(fit_command, say, STOP_SECONDS), args.jobs or 1
    if args.executor == "slurm" and shutil.which("sbatch") is None:
        print("seqvae sweep: error: --executor slurm: no sbatch on this machine (run it on a SLURM login node)", file=sys.stderr)
        return None
    folder = cells[0].run_dir.parents[1] / ".submitit"  # submitit's pickles and logs: <root>/.submitit/<job id>_*
    runner = executors.SubmititRunner(args.executor, folder, overrides, fit_command, say)
    return runner, args.jobs or (len(cells) if args.executor == "slurm" else 1)


@contextlib.contextmanager
def interruptible():
    """`kill PID` of the sweep stops it like Ctrl-C (KeyboardInterrupt), not orphaning the cells;
    the signal handlers as they were afterwards."""

    def terminate(signum, frame):
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers may be set
    previous = signal.signal(signal.SIGTERM, terminate) if main_thread else None
    # A sweep started with `&` from a script ignores SIGINT, and its fits would inherit that: the
    # SIGINT that stops them would be lost and each killed STOP_SECONDS later. A handler set here
    # is reset to the default in each fit, where Python turns SIGINT into KeyboardInterrupt.
    ignored_sigint = main_thread and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored_sigint:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        if ignored_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
