"""Where a sweep's cells run (`seqvae sweep GRID --executor local|slurm|submitit-local`): the
`--executor` options, and the submitit runner.

`local` (the default) runs each cell as a subprocess of the sweep (`local.LocalRunner`). `slurm`
submits each cell as one submitit job (sbatch); `submitit-local` takes the same path with
submitit's LocalExecutor (what CI and a laptop use). A job runs `seqvae fit` as its subprocess,
output in the cell's `sweep.log`. The sweep follows its jobs in the foreground (a cell that
`needs` another is submitted once that one finished); stopped, it leaves them running, and the
same command again follows them (a cell whose job is queued or running is not submitted twice).

Resources: the grid file's `slurm:` mapping (a variant's own `slurm:` wins), and `--slurm.KEY VALUE`
on the command line (wins over both); timeout_min defaults to a day:
    slurm: {partition: gpu, account: myproj, qos: normal, constraint: a100, nodes: 1,
            gpus_per_node: 1, cpus_per_task: 8, mem_gb: 32, timeout_min: 240}

A cell with `gpus_per_node` G > 0 runs with one task per GPU (`tasks_per_node` = G) and its fit
gets `--trainer.accelerator gpu --trainer.devices G --trainer.num_nodes N` (+ `--trainer.strategy
ddp` when G·N > 1): Lightning's SLURMEnvironment finds the ranks in each task's SLURM variables.
submitit-local passes G and the time limit on and ignores the cluster-only keys.

Preemption and time limits: the job is a `submitit.helpers.Checkpointable`. At submitit's signal
(USR2 `signal_delay_s` before the time limit, or at preemption) its `checkpoint()` stops the fit
(SIGINT; SIGKILL after REQUEUE_STOP_SECONDS) and submitit requeues the same cell; the requeued job
starts the fit again with `--ckpt_path last.ckpt` (PeriodicCheckpoint's mid-epoch checkpoint or the
last epoch's one): the exact resume of an interrupted local cell. At most REQUEUES time-outs per job.

A job writes the cell's sweep.job, sweep.run and sweep.log as a local cell does (`cells.py`, which
also holds the constants both runners share); `job_state` tells a recorded job's state to `live`
and to `--status` (`status.py`).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import submitit
from submitit.helpers import Checkpointable

from seqvae.experiments.cells import (  # noqa: F401  (read_json, write_json: the state files' API here too)
    LOG_FILE,
    POLL_SECONDS,
    REQUEUE_STOP_SECONDS,
    TAIL_LINES,
    config_digests,
    dies_with_parent,
    log_tail,
    mark_ended,
    mark_requeued,
    mark_started,
    now,
    pid_alive,
    proc_start,
    read_job,
    read_json,
    write_job,
    write_json,
)
from seqvae.experiments.grid import SLURM_KEYS, Cell, GridError, slurm_value

EXECUTORS = ("local", "slurm", "submitit-local")
REQUEUES = 10  # time-outs a job may be requeued after (preemptions do not count)
DEFAULT_TIMEOUT_MIN = {"slurm": 24 * 60, "submitit-local": 30 * 24 * 60}
RUNNING_STATES = ("RUNNING", "COMPLETING")
QUEUED_STATES = ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "SUSPENDED", "READY", "PREEMPTED")


# ------------------------------------------------------------------------------------- submitit
def add_arguments(parser) -> None:
    """`--executor` and the `--slurm.KEY VALUE` overrides of `seqvae sweep`."""
    help = "where cells run: local subprocesses (default), SLURM jobs or local submitit jobs (seqvae/experiments/executors.py)"
    parser.add_argument("--executor", choices=EXECUTORS, default="local", help=help)
    for key in SLURM_KEYS:
        parser.add_argument(f"--slurm.{key}", dest=f"slurm_{key}", metavar="V", help=f"overrides the grid's slurm.{key}")


def slurm_overrides(args) -> dict:
    """The checked `--slurm.KEY` values; GridError names the option."""
    given = {k: getattr(args, f"slurm_{k}") for k in SLURM_KEYS if getattr(args, f"slurm_{k}") is not None}
    if given and args.executor == "local":
        raise GridError(f"--slurm.{next(iter(given))}: only with --executor slurm or submitit-local")
    return {k: slurm_value(k, v, f"--slurm.{k}") for k, v in given.items()}


def fit_device_args(resources: dict) -> list[str]:
    """The fit options that match a cell's GPUs: one device per task, DDP over several."""
    gpus, nodes = resources.get("gpus_per_node", 0), resources.get("nodes", 1)
    if not gpus:
        return []
    args = ["--trainer.accelerator", "gpu", "--trainer.devices", str(gpus), "--trainer.num_nodes", str(nodes)]
    return args + (["--trainer.strategy", "ddp"] if gpus * nodes > 1 else [])


def executor_parameters(kind: str, cell: Cell, resources: dict) -> dict:
    """submitit's AutoExecutor parameters of one cell (generic names; cluster-only ones slurm_-prefixed)."""
    gpus = resources.get("gpus_per_node", 0)
    params = {
        "name": f"{cell.variant}-seed{cell.seed}",
        "timeout_min": resources.get("timeout_min", DEFAULT_TIMEOUT_MIN[kind]),
        "nodes": resources.get("nodes", 1),
        "gpus_per_node": gpus or None,  # no --gpus-per-node=0 line: clusters without GPUs refuse it
        "tasks_per_node": max(1, gpus) if kind == "slurm" else 1,  # submitit-local: Lightning's own launcher
    }
    if kind == "slurm":
        params.update(cpus_per_task=resources.get("cpus_per_task"), mem_gb=resources.get("mem_gb"))
        params.update({f"slurm_{k}": resources[k] for k in ("partition", "account", "qos", "constraint") if k in resources})
    return {k: v for k, v in params.items() if v is not None}


def make_executor(kind: str, folder: Path, cell: Cell, resources: dict) -> submitit.AutoExecutor:
    cluster = "slurm" if kind == "slurm" else "local"
    executor = submitit.AutoExecutor(folder, cluster, slurm_max_num_timeout=REQUEUES, local_max_num_timeout=REQUEUES)
    executor.update_parameters(**executor_parameters(kind, cell, resources))
    return executor


def _job_env() -> tuple[str | None, int]:
    """(job id, global rank) inside a submitit job; (None, 0) outside."""
    try:
        env = submitit.JobEnvironment()
        return env.job_id, env.global_rank
    except Exception:  # noqa: BLE001 - not in a submitit job (a direct call)
        return None, 0


def _fit_signals(
    dies_with_job,
):  # before exec: the job handles preemption; SIGINT stops the fit even if the sweep ignores it (`… &`)
    signal.signal(submitit.JobEnvironment._usr_sig(), signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # inherited SIG_IGN: no KeyboardInterrupt, killed after REQUEUE_STOP_SECONDS
    dies_with_job()  # a job killed outright (scancel --signal KILL, kill -9) stops its fit: no orphan writing the run


class CellJob(Checkpointable):
    """What a submitted cell runs: `seqvae fit` with the cell's arguments (+ `--ckpt_path last.ckpt`
    when the run directory has one) in a subprocess; returns its exit status. Rank 0 writes
    sweep.log and sweep.run; the other tasks of a DDP cell write sweep.rank<N>.log."""

    def __init__(self, cell: Cell, command: list[str], extra_args: list[str], env: dict[str, str], cwd: str):
        self.cell, self.command, self.extra_args, self.env, self.cwd = cell, command, extra_args, env, cwd
        self._proc = None

    def __getstate__(self):
        return {**self.__dict__, "_proc": None}

    def __call__(self) -> int:
        os.chdir(self.cwd)
        cell = self.cell
        job_id, rank = _job_env()
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        args = [*cell.fit_args(), *self.extra_args]
        with open(cell.run_dir / (LOG_FILE if rank == 0 else f"sweep.rank{rank}.log"), "a", encoding="utf-8") as log:
            log.write(f"# {now()} seqvae fit {' '.join(args)}  (job {job_id}, rank {rank})\n")
            log.flush()
            configs = config_digests(cell.args)  # before the fit reads them
            self._proc = subprocess.Popen(
                [*self.command, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                preexec_fn=functools.partial(_fit_signals, dies_with_parent(own_group=False)),
            )
            if rank == 0:
                mark_started(cell.run_dir, job_id or str(self._proc.pid), self._proc.pid, cell.args, configs)
            while self._proc.poll() is None:  # not wait(): checkpoint() may wait for it from a signal handler
                time.sleep(0.5)
        code = self._proc.returncode
        if rank == 0:
            mark_ended(cell.run_dir, code)
        return code

    def checkpoint(self, *args, **kwargs):
        """Preempted or at the time limit: stops the fit, then the same cell is requeued; it resumes
        from last.ckpt (submitit dumps the returned submission and requeues the job)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Lightning stops cleanly
            try:
                proc.wait(timeout=REQUEUE_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if _job_env()[1] == 0:
            mark_requeued(self.cell.run_dir)
        return super().checkpoint(*args, **kwargs)


class JobHandle:
    """A submitted cell's job, followed by this sweep or found in sweep.job by a later one."""

    def __init__(self, kind: str, job_id: str, folder: str, job=None, pid_start: str | None = None):
        self.kind, self.job_id, self.folder, self.pid_start = kind, job_id, folder, pid_start
        self.job = job or (submitit.SlurmJob if kind == "slurm" else submitit.LocalJob)(folder, job_id)

    def state(self) -> str:
        """RUNNING, QUEUED, ENDED or UNKNOWN (sacct not available here)."""
        if self.kind == "slurm":
            if shutil.which("sacct") is None:
                return "UNKNOWN"
            state = (self.job.watcher.get_state(self.job_id, mode="force").split() or ["UNKNOWN"])[0]
            return "RUNNING" if state in RUNNING_STATES else "QUEUED" if state in QUEUED_STATES else state
        if getattr(self.job, "_process", None) is not None:  # submitted by this sweep: its controller process
            return "RUNNING" if self.job._process.poll() is None else "ENDED"
        return "RUNNING" if pid_alive(self.job_id, self.pid_start) else "ENDED"

    def done(self) -> bool:
        if self.kind == "slurm":
            return self.job.done()
        return self.state() == "ENDED"

    def outcome(self) -> tuple[int | None, list[str]]:
        """(the fit's exit status, or None when the job itself failed; lines that say why)."""
        first = self.job.task(0)
        if first.paths.result_pickle.exists():
            try:
                return first.result(), []
            except Exception as err:  # noqa: BLE001 - the job raised: its traceback
                return None, str(err).splitlines()[-TAIL_LINES:]
        lines = [f"job {self.job_id} ended without a result ({first.paths.result_pickle} missing); its stderr:"]
        return None, lines + log_tail(first.paths.stderr)


class SubmititRunner:
    """Runs cells as submitit jobs for `schedule.run_grid`: `run` submits one and follows it to its end;
    `live` finds a job of an earlier sweep still queued or running, and `follow` waits for it."""

    def __init__(self, kind: str, root_folder: Path, overrides: dict, command, say):
        self.kind, self.folder, self.overrides, self.command, self.say = kind, root_folder, overrides, command, say
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def resources(self, cell: Cell) -> dict:
        return {**cell.slurm, **self.overrides}

    def submit(self, cell: Cell, one_thread: bool = False) -> JobHandle:
        resources = self.resources(cell)
        env = {"PYTHONUNBUFFERED": "1"}
        if one_thread and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = "1"
        job = CellJob(cell, self.command([]), fit_device_args(resources), env, os.getcwd())
        folder = self.folder.absolute()
        with self._lock:  # one submission at a time (sbatch, pickles)
            cell.run_dir.mkdir(parents=True, exist_ok=True)
            submitted = make_executor(self.kind, folder, cell, resources).submit(job)
        start = proc_start(int(submitted.job_id)) if self.kind != "slurm" else None
        write_job(cell.run_dir, self.kind, submitted.job_id, folder=str(folder), pid_start=start, submitted=now())
        self.say(f"{cell.tag}: submitted as {self.kind} job {submitted.job_id} (log {cell.run_dir / LOG_FILE})")
        return JobHandle(self.kind, submitted.job_id, str(folder), job=submitted, pid_start=start)

    def live(self, cell: Cell) -> JobHandle | None:
        info = read_job(cell.run_dir)
        if info.get("executor") != self.kind or job_state(info) not in ("RUNNING", "QUEUED"):
            return None
        return JobHandle(self.kind, str(info["job_id"]), info["folder"], pid_start=info.get("pid_start"))

    def run(self, cell: Cell, one_thread: bool = False) -> tuple[int | None, list[str]]:
        return self.follow(cell, self.submit(cell, one_thread))

    def follow(self, cell: Cell, handle: JobHandle) -> tuple[int | None, list[str]]:
        while not handle.done():
            if self._stop.wait(POLL_SECONDS):
                return None, [f"not followed any more; job {handle.job_id} goes on"]
        code, why = handle.outcome()
        return code, (log_tail(cell.run_dir / LOG_FILE) if code is None or code else []) + why

    def stop(self) -> None:
        self._stop.set()


# ------------------------------------------------------------------------------------- a recorded job
def job_state(info: dict) -> str | None:
    """RUNNING, QUEUED, ENDED, UNKNOWN (cannot tell from here), or None (no job recorded)."""
    if not info.get("job_id"):
        return None
    if info.get("executor") == "local":
        alive = pid_alive(info["job_id"], info.get("pid_start"), info.get("host"))
        return "UNKNOWN" if alive is None else "RUNNING" if alive else "ENDED"
    if info.get("executor") == "submitit-local" and info.get("host") != socket.gethostname():
        return "UNKNOWN"
    try:
        return JobHandle(info["executor"], str(info["job_id"]), info.get("folder", "."), pid_start=info.get("pid_start")).state()
    except Exception:  # noqa: BLE001 - a status table must not fail on one cell
        return "UNKNOWN"
