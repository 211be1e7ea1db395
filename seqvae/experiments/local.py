"""`seqvae sweep --executor local` (the default): each cell a `seqvae fit` subprocess of the sweep,
`--jobs N` of them side by side, with a progress line at each checkpoint it saves; the other
runner, `executors.SubmititRunner`, has the same interface (`run`, `live`, `stop`).

Each fit runs in its own process group, so an interruption (Ctrl-C, or `kill PID` turned into one
by the sweep) reaches the sweep's main thread only; `LocalRunner.stop` passes one SIGINT on to each
fit at once (Lightning's clean stop, the last checkpoint stays), and the threads that follow them
record "interrupted" in sweep.run, or the fit's own status when it finished meanwhile. A sweep
killed outright (`kill -9`) takes its fits with it: the kernel sends each a SIGINT
(`cells.dies_with_parent`).
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time

from seqvae.clock import clock
from seqvae.experiments.cells import (
    LOG_FILE,
    POLL_SECONDS,
    STOP_SECONDS,
    TAIL_LINES,
    checkpoint_position,
    command_line,
    config_digests,
    dies_with_parent,
    fit_command,
    mark_ended,
    mark_started,
    max_epochs,
    now,
    proc_start,
    say,
    write_job,
)
from seqvae.experiments.grid import Cell


class LocalRunner:
    """Cells as subprocesses of the sweep. `command(args)`: the fit's command line (`cells.fit_command`);
    `stop`: the seconds of `stop_processes`."""

    def __init__(self, command=fit_command, say=say, stop: float = STOP_SECONDS):
        self.command, self.say, self.stop_seconds = command, say, stop
        self._live: set[subprocess.Popen] = set()  # the cells' processes while they run
        self._stopping = threading.Event()  # the sweep was interrupted

    def run(self, cell: Cell, one_thread: bool = False) -> tuple[int | None, list[str]]:
        """Runs one `seqvae fit`; its output goes to sweep.log. Returns (exit status, stderr tail).
        `one_thread`: cells run side by side, so each gets one torch thread unless OMP_NUM_THREADS
        says otherwise (several multi-threaded runs on the same cores stall each other)."""
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        start = time.monotonic()
        with open(cell.run_dir / LOG_FILE, "a", encoding="utf-8") as log:
            proc = self._start(cell, one_thread, log)
            reader = threading.Thread(target=_copy_stderr, args=(proc, log, tail), daemon=True)
            reader.start()
            try:
                self._follow(cell, proc, start)
            except KeyboardInterrupt:
                # Only where run runs on the main thread (a direct call): the sweep runs cells in
                # pool threads, and stop() stops them. A fit that missed the SIGINT gets one.
                self.stop_processes([proc])
                mark_ended(cell.run_dir, "interrupted")  # --status: resumable, not failed
                raise
            finally:
                reader.join(timeout=10)
                self._live.discard(proc)
        # --status: a cell stopped by the sweep's interruption is resumable, not failed; one that
        # finished meanwhile (its test was under way) keeps its own status
        stopped = self._stopping.is_set() and not (proc.returncode == 0 and cell.state() == "finished")
        mark_ended(cell.run_dir, "interrupted" if stopped else proc.returncode)
        return proc.returncode, list(tail)

    def _start(self, cell: Cell, one_thread: bool, log) -> subprocess.Popen:
        """The fit's process, with its start in sweep.log, sweep.job and sweep.run."""
        args = cell.fit_args()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if one_thread:
            env.setdefault("OMP_NUM_THREADS", "1")
        log.write(f"# {now()} {command_line(args)}\n")
        log.flush()
        configs = config_digests(cell.args)  # before the fit reads them
        proc = subprocess.Popen(
            self.command(args),
            stdout=log,
            stderr=subprocess.PIPE,
            env=env,
            encoding="utf-8",
            errors="replace",
            preexec_fn=dies_with_parent(own_group=True),
        )
        self._live.add(proc)
        write_job(cell.run_dir, "local", str(proc.pid), pid_start=proc_start(proc.pid))
        mark_started(cell.run_dir, str(proc.pid), proc.pid, cell.args, configs)
        return proc

    def _follow(self, cell: Cell, proc: subprocess.Popen, start: float) -> None:
        """Waits for the fit, with a progress line each time its last.ckpt changes."""
        seen = cell.last_ckpt.stat().st_mtime if cell.last_ckpt.exists() else None
        while True:
            try:
                proc.wait(timeout=POLL_SECONDS)
                return
            except subprocess.TimeoutExpired:
                pass
            mtime = cell.last_ckpt.stat().st_mtime if cell.last_ckpt.exists() else None
            if mtime is not None and mtime != seen:
                where = checkpoint_position(cell.last_ckpt, max_epochs(cell.run_dir))
                if where is not None:
                    seen = mtime
                    self.say(f"{cell.tag}: {where} saved, {clock(time.monotonic() - start)} elapsed")

    def live(self, cell: Cell):
        return None  # a local cell lives only as long as the sweep that runs it

    def stop(self) -> None:
        """The sweep was interrupted: each cell gets one SIGINT, Lightning's clean stop; its last
        checkpoint stays, so rerunning the sweep resumes it. A cell that does not stop is killed."""
        self._stopping.set()
        self.stop_processes(list(self._live))

    def stop_processes(self, procs: list[subprocess.Popen]) -> None:
        """Sends each fit one SIGINT at once (in their own process groups, they had none from the
        terminal), then kills a fit that is still running `stop` seconds later."""
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=self.stop_seconds)
            except subprocess.TimeoutExpired:
                proc.kill()


def _copy_stderr(proc: subprocess.Popen, log, tail: collections.deque) -> None:
    """The fit's stderr into sweep.log, its last lines kept for a failure's report."""
    for line in proc.stderr:
        log.write(line)
        log.flush()
        tail.append(line.rstrip("\n"))
