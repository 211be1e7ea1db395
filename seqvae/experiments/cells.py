"""A sweep cell's run, as both runners (`local.LocalRunner`, `executors.SubmititRunner`), the grid
(`grid.Cell`), the scheduler (`schedule.run_grid`) and `--status` (`status.py`) see it: the command a
cell runs, the files it leaves in its run directory, and the questions asked of them.

Files in a cell's run directory (all `--status` and a rerun need, on the shared filesystem):
    sweep.log   the fit's output (stdout and stderr), one `# <time> seqvae fit …` line per start
    sweep.job   who runs the cell: {"executor", "job_id", "host", "pid_start", "folder", "submitted"}
                (local: the fit's pid; submitit: the job's id, folder and submission time)
    sweep.run   the fit: {"job_id", "host", "pid", "pid_start", "started", "args", "configs"}, then "ended" and
                "exit" (its status, or "interrupted" when the sweep stopped it), or "requeued";
                "configs": {file: sha256} of every config file the fit read (`config_digests`)
    checkpoints/last.ckpt, metrics.json   the fit's own: where it stands, and that it finished

Torch-free at import: the checkpoint questions load torch when asked.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import yaml

from seqvae.store.files import CONFIG, METRICS, atomic_write_text, checkpoint_path

JOB_FILE, RUN_FILE, LOG_FILE = "sweep.job", "sweep.run", "sweep.log"  # the sweep's own files in a run directory

POLL_SECONDS = 2.0  # how often a running cell (a fit, a job) is looked at
TAIL_LINES = 20  # the lines of a failed cell's output (stderr, sweep.log, a traceback) that are printed
# Two stop timeouts, different on purpose: after SIGINT, how long a fit gets to save its checkpoint
# and stop before it is killed.
# - The sweep was interrupted (Ctrl-C, `kill PID`): nothing else kills the fit meanwhile, so it gets
#   time for a mid-epoch checkpoint of a large model.
STOP_SECONDS = 120
# - A submitit job at its time limit or preempted (`executors.CellJob.checkpoint`): submitit's signal
#   comes `signal_delay_s` before SLURM kills the job (90 s by default), and after the fit stopped the
#   job must still pickle itself and be requeued, so the fit gets less than that.
REQUEUE_STOP_SECONDS = 60


# ------------------------------------------------------------------------------------- the command
_OUTPUT = threading.Lock()  # the pool threads' progress lines and the main thread's


def say(text: str, more: list[str] | tuple = ()) -> None:
    """One line of the sweep's own output on stderr, and `more` lines under it (indented), written
    whole: `print` writes a line and its newline apart, so two threads' lines ran together."""
    with _OUTPUT:
        sys.stderr.write("".join(f"{line}\n" for line in [f"seqvae sweep: {text}", *(f"    {m}" for m in more)]))
        sys.stderr.flush()


def fit_command(args: list[str]) -> list[str]:
    # The interpreter running the sweep, so the cells see the same environment and package.
    # `-m`, not `-c`: Lightning's DDP launcher restarts sys.argv for the other ranks.
    return [sys.executable, "-m", "seqvae.cli", "fit", *args]


def command_line(args: list[str]) -> str:
    """A cell's `seqvae fit` as one shell line (dry runs, sweep.log)."""
    return "seqvae fit " + shlex.join(args)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent(own_group: bool):
    """A `preexec_fn` for a fit: the kernel sends it SIGINT (Lightning's clean stop: the last
    checkpoint stays) when the thread that started it dies, even by `kill -9` of the sweep
    (PR_SET_PDEATHSIG). Chosen over a fit that polls its parent: it needs nothing from the fit's
    code (`seqvae.cli` is a plain `seqvae fit`), costs nothing while it runs and acts at once. The
    thread that starts a fit follows it until it ends (`LocalRunner.run`, `CellJob.__call__`), so
    only the sweep's (or the job's) death fires it. Linux only; elsewhere a killed sweep's fits run
    on, and a rerun refuses their cells while they do (`sweep.check_no_live_fits`).
    `own_group`: the fit gets its own process group, so that a terminal's Ctrl-C reaches the sweep
    alone, which passes exactly one SIGINT on to each fit at once (`LocalRunner.stop`)."""
    parent = os.getpid()
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes  # loaded here, not after the fork

        prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec():
        if own_group:
            os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGINT))
            if os.getppid() != parent:  # the sweep died between the fork and the prctl
                os._exit(130)

    return preexec


# ------------------------------------------------------------------------------------- state files
def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1) + "\n")  # a reader never sees half of it


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def proc_start(pid: int) -> str | None:
    """The start time of a process (/proc), which tells a reused pid from the one recorded; "Z"
    for a zombie (ended, not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return "Z" if fields[0] == "Z" else fields[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid, start=None, host=None) -> bool | None:
    """Whether the recorded process still runs (None: it ran on another host)."""
    if host is not None and host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:
        pass
    return start is None or proc_start(int(pid)) in (None, start)


def read_job(run_dir: Path) -> dict:
    return read_json(run_dir / JOB_FILE)


def read_run(run_dir: Path) -> dict:
    return read_json(run_dir / RUN_FILE)


def write_job(run_dir: Path, executor: str, job_id: str, **more) -> None:
    """sweep.job: who runs the cell (this host; `more`: pid_start, folder, submitted)."""
    write_json(run_dir / JOB_FILE, {"executor": executor, "job_id": job_id, "host": socket.gethostname(), **more})


def mark_started(run_dir: Path, job_id: str, pid: int, args: list[str] | None = None, configs: dict | None = None) -> None:
    """`args`: the cell's `seqvae fit` arguments from its grid (without --ckpt_path), so that a
    later sweep can tell a finished cell whose grid entry was edited since (`recorded_args`);
    `configs`: the digests of the config files it read (`config_digests`, taken before it started)."""
    info = {"job_id": job_id, "host": socket.gethostname(), "pid": pid, "pid_start": proc_start(pid), "started": now()}
    info.update({"args": list(args)} if args is not None else {})
    write_json(run_dir / RUN_FILE, {**info, **({"configs": dict(configs)} if configs is not None else {})})


def mark_ended(run_dir: Path, code: int | str | None) -> None:
    """`code`: the fit's exit status, or "interrupted" (stopped by the sweep: resumable, not failed)."""
    write_json(run_dir / RUN_FILE, {**read_run(run_dir), "ended": now(), "exit": code})


def mark_requeued(run_dir: Path) -> None:
    write_json(run_dir / RUN_FILE, {**read_run(run_dir), "requeued": now()})


def log_tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f.readlines()[-lines:]]
    except OSError:
        return []


WARNING = "seqvae: warning: "  # how `seqvae fit` starts a warning line (cli, datamodule, bn_bound)


def run_warnings(run_dir: Path) -> list[str]:
    """The distinct warnings of the cell's latest start (sweep.log after its last `# … seqvae fit`
    line), in order, without the prefix: the sweep repeats them in its own output."""
    try:
        text = (run_dir / LOG_FILE).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("# ") and " seqvae fit " in line]
    found = [line[len(WARNING) :] for line in lines[starts[-1] if starts else 0 :] if line.startswith(WARNING)]
    return list(dict.fromkeys(found))


# ------------------------------------------------------------------------------------- questions
def last_ckpt(run_dir: Path) -> Path:
    return checkpoint_path(run_dir)  # <run_dir>/checkpoints/last.ckpt


def state(run_dir: Path, export_dir: Path | None) -> str:
    """finished (metrics.json), interrupted (a last.ckpt to resume from), exported (finished on
    another machine: its results are in `export_dir`, its run directory is not here) or new."""
    if (run_dir / METRICS).is_file():
        return "finished"
    if last_ckpt(run_dir).is_file():
        return "interrupted"
    if export_dir is not None and (export_dir / METRICS).is_file():
        return "exported"
    return "new"


def has_leftovers(run_dir: Path) -> bool:
    """A run directory with files but no checkpoint: a start that failed before its first one."""
    return run_dir.exists() and any(run_dir.iterdir())


def recorded_args(run_dir: Path) -> list[str] | None:
    """The grid arguments the cell's run started with (sweep.run), None if not recorded."""
    args = read_run(run_dir).get("args")
    return args if isinstance(args, list) else None


def recorded_configs(run_dir: Path) -> dict[str, str] | None:
    """{file: sha256} of the config files the cell's run read (sweep.run), None if not recorded
    (a cell run before the sweep recorded them)."""
    configs = read_run(run_dir).get("configs")
    return configs if isinstance(configs, dict) else None


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # gone (or unreadable) since


def config_digests(args: list[str]) -> dict[str, str | None]:
    """{file: sha256} of every config file a cell's `seqvae fit` reads: the files its arguments name
    (`--config`, or an option's value naming a .yaml/.yml/.json file) and, recursively, those each
    file names (a `config:` key, or a group given as a file, `model: model.yaml`), which jsonargparse
    reads relative to the file naming them. The paths as the arguments write them, the nested ones
    joined to their parent's directory; None for a file that cannot be read."""
    todo = [a for a in args if a.endswith(CONFIG_SUFFIXES) and Path(a).is_file()]
    digests: dict[str, str | None] = {}
    while todo:
        name = todo.pop(0)
        if name in digests:
            continue
        digests[name] = file_digest(Path(name))
        try:
            content = yaml.safe_load(Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # its digest says it changed; the fit's parser names the error
        todo += [n for n in _named_files(content, Path(name).parent) if n not in digests]
    return digests


def _named_files(node, base: Path) -> list[str]:
    """The existing files that strings in a parsed config file name (relative to `base`)."""
    if isinstance(node, str) and node.endswith(CONFIG_SUFFIXES):
        path = Path(node) if Path(node).is_absolute() else base / node
        return [os.path.normpath(path)] if path.is_file() else []
    if isinstance(node, dict):
        return [n for v in node.values() for n in _named_files(v, base)]
    if isinstance(node, list):
        return [n for v in node for n in _named_files(v, base)]
    return []


def max_epochs(run_dir: Path) -> int | None:
    try:
        return (yaml.safe_load((run_dir / CONFIG).read_text()) or {}).get("trainer", {}).get("max_epochs")
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _load_checkpoint(path: Path) -> dict:
    # only when asked: the sweep itself runs without torch. Through the one loader, which declares
    # the strategy classes the file pickled before reading it (a bare torch.load refused a
    # checkpoint holding, e.g., a LinearKLWarmup in a process that had not imported it).
    from seqvae.store.checkpoints import load_checkpoint

    return load_checkpoint(path, "last.ckpt", mmap=True)  # data, never code


def checkpoint_position(path: Path, of: int | None) -> str | None:
    """Where `last.ckpt` was saved: "epoch 3/20" at an epoch end, "epoch 4/20, batch 120" mid-epoch
    (PeriodicCheckpoint); None while it is being written."""
    try:
        ckpt = _load_checkpoint(path)
        epoch = f"epoch {int(ckpt['epoch']) + 1}{f'/{of}' if of else ''}"
        batches = ckpt.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
        if batches and not batches.get("is_last_batch", True):
            return f"{epoch}, batch {batches['current']['processed']}"
        return epoch
    except Exception:  # noqa: BLE001 - a half-written file; the next poll reads it
        return None


def checkpoint_summary(path: Path, of: int | None) -> tuple[str, str]:
    """("2/20, batch 120", "val/loss 95.312") of a last.ckpt: where it was saved and the latest
    score of the checkpoint callback's monitor."""
    where = (checkpoint_position(path, of) or "").removeprefix("epoch ")
    try:
        ckpt = _load_checkpoint(path)
        for key, value in ckpt.get("callbacks", {}).items():
            if key.startswith("ModelCheckpoint") and value.get("current_score") is not None:
                return where, f"{value['monitor']} {float(value['current_score']):.3f}"
    except Exception:  # noqa: BLE001 - being written; the next --status reads it
        pass
    return where, ""
