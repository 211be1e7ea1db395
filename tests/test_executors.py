"""`seqvae sweep --executor slurm|submitit-local` (seqvae/executors.py): real tiny cells through
submitit's LocalExecutor (one killed mid-run and resumed by a second invocation), the requeue of
a signalled job through submitit's own signal handling, the SLURM path against submitit's mocked
sbatch/sacct (no cluster here), the DDP parameters of a multi-GPU cell, and `--status`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from submitit.core import submission
from submitit.core.test_core import MockedSubprocess
from submitit.slurm.slurm import SlurmJob
from test_sweep import DEMO, REPO, in_repo, tiny, write_grid  # noqa: F401  (fixtures)

from seqvae.experiments import executors, sweep
from seqvae.experiments.grid import Cell

pytestmark = pytest.mark.usefixtures("in_repo")  # the grids name configs/demo.yaml


def wait_for(condition, what: str, limit: float = 120.0):
    """Polls until condition() is true; the limit only keeps a broken run from hanging the suite."""
    end = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.02)


@pytest.fixture
def in_thread(monkeypatch):
    """Runs sweep.main(argv) in a thread (the test plays the cluster or the killer meanwhile); a
    failed test stops its runner, so that no thread keeps following jobs after it."""
    runners, threads = [], []
    init = executors.SubmititRunner.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(executors.SubmititRunner, "__init__", record)

    def start(argv: list[str]) -> tuple[threading.Thread, dict]:
        out: dict = {}
        threads.append(threading.Thread(target=lambda: out.update(code=sweep.main(argv)), daemon=True))
        threads[-1].start()
        return threads[-1], out

    yield start
    for runner in runners:
        runner.stop()
    for thread in threads:
        thread.join(timeout=30)


@pytest.fixture
def keep_signals():
    """submission.process_job installs submitit's handlers in this process: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


# ------------------------------------------------------------------------------------- submitit-local, real cells
def test_submitit_local_grid_with_a_cell_killed_mid_run_and_resumed(tiny, tmp_path, capsys):  # noqa: F811
    root = tmp_path / "runs"
    overrides = {"trainer.max_epochs": 12, "periodic_checkpoint.every_n_batches": 1}
    g = {"root": str(root), "configs": [DEMO, str(tiny / "tiny.yaml")], "overrides": overrides, "seeds": [1]}
    g["variants"] = [{"name": "a", "overrides": {"model.pooling": "last"}}, {"name": "b", "overrides": {"model.pooling": "max"}}]
    path = write_grid(tmp_path / "grid.yaml", g)
    a, b = root / "a" / "seed1", root / "b" / "seed1"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "seqvae.experiments.sweep", str(path), "--executor", "submitit-local"]
    first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # 1. Kill a's fit once it saved a mid-epoch checkpoint: the other cell goes on, a is reported.
    wait_for(
        lambda: (a / "checkpoints" / "last.ckpt").is_file() and "pid" in executors.read_json(a / "sweep.run"), "a's checkpoint"
    )
    pid = executors.read_json(a / "sweep.run")["pid"]
    os.kill(pid, signal.SIGSTOP)  # frozen: it cannot finish between this check and the kill
    assert not (a / "metrics.json").exists()
    os.kill(pid, signal.SIGKILL)
    out, err = first.communicate(timeout=300)
    assert first.returncode == 1, err
    job_a = executors.read_json(a / "sweep.job")
    assert job_a["executor"] == "submitit-local" and (root / ".submitit" / f"{job_a['job_id']}_submitted.pkl").is_file()
    assert f"seqvae sweep: [1/2] a/seed1: submitted as submitit-local job {job_a['job_id']} (log {a / 'sweep.log'})\n" in err
    assert "seqvae sweep: [1/2] a/seed1: FAILED (exit -9) after " in err
    assert "    # " in err and "seqvae fit --config" in err  # the tail of a's sweep.log
    assert "seqvae sweep: [2/2] b/seed1: done in " in err and (b / "metrics.json").is_file()
    assert re.search(r"seqvae sweep: grid 0/2 done, 1 failed, 0 running, 1 left, \d+:\d\d elapsed, ETA \?\n", err)
    assert re.search(r"seqvae sweep: grid 1/2 done, 1 failed, 0 running, 0 left, \d+:\d\d elapsed, ETA 0:00\n", err)
    assert "seqvae sweep: 2 cells (1 failed, 1 ran) in " in err
    assert [line.split(" | ")[1] for line in out.splitlines() if line.startswith("| ")][1:] == ["1"]  # b's row

    # 2. --status: a failed at its checkpoint's position, b done; the job ids of sweep.job.
    assert sweep.main([str(path), "--status"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["cell", "state", "epoch", "last", "metric", "job"]
    # killed early: no val/loss yet
    row_a = r"a/seed1 +failed \(exit -9\) +\d+/12(, batch \d)?( +val/loss \d+\.\d{3})? +submitit-local (\d+)"
    assert re.fullmatch(row_a, lines[1]) and re.fullmatch(row_a, lines[1]).group(3) == job_a["job_id"], lines[1]
    job_b = executors.read_json(b / "sweep.job")["job_id"]
    assert re.fullmatch(rf"b/seed1 +done +12/12 +test/iw_nll \d+\.\d{{3}} +submitit-local {job_b}", lines[2]), lines[2]
    assert lines[3] == "2 cells: 1 failed, 1 done"

    # 3. A second invocation resumes a from its last.ckpt and skips b.
    assert sweep.main([str(path), "--executor", "submitit-local"]) == 0
    out, err = capsys.readouterr()
    assert f"seqvae sweep: [1/2] a/seed1: resuming from {a}/checkpoints/last.ckpt\n" in err
    assert f"seqvae sweep: [2/2] b/seed1: finished ({b}/metrics.json), skipped\n" in err
    assert json.loads((a / "metrics.json").read_text())["epochs"] == 12
    assert f"--ckpt_path {a}/checkpoints/last.ckpt" in (a / "sweep.log").read_text()
    assert "| pooling=last | 1 |" in out and "| pooling=max | 1 |" in out
    assert sweep.main([str(path), "--status"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 cells: 2 done"


# ------------------------------------------------------------------------------------- requeue
FAKE_FIT = """
import json, sys, time
from pathlib import Path
a = sys.argv[1:]
value = lambda key: a[a.index(key) + 1]
logger = "--trainer.logger.init_args."
run = Path(value(logger + "save_dir")) / value(logger + "name") / value(logger + "version")
(run / "checkpoints").mkdir(parents=True, exist_ok=True)
print("fit", " ".join(a), flush=True)
if "--wait_for" in a:
    while not Path(value("--wait_for")).exists():
        time.sleep(0.05)
elif "--ckpt_path" not in a and "--finish" not in a:
    try:  # last.ckpt is the test's cue to signal: a SIGINT can only come inside the try
        (run / "checkpoints" / "last.ckpt").write_bytes(b"")
        time.sleep(300)
    except KeyboardInterrupt:
        print("stopped by SIGINT", flush=True)
        sys.exit(130)
(run / "config.yaml").write_text("model: {name: %s}\\n" % run.parent.name)
(run / "metrics.json").write_text(json.dumps({"test/iw_nll": 1.0, "epochs": 2}))
"""


def fake(monkeypatch):
    monkeypatch.setattr(sweep, "fit_command", lambda args: [sys.executable, "-c", FAKE_FIT, *args])
    monkeypatch.setattr(sweep, "check_variants", lambda cells: None)  # the fake fit takes options `seqvae fit` does not


@pytest.fixture(params=["sigint default", "sigint ignored"])
def sigint(request):
    """The sweep's SIGINT disposition, which its jobs and fits inherit: ignored when it was started
    with `&` from a script (a non-interactive shell), as `nohup seqvae sweep … &` is."""
    disposition = signal.SIG_IGN if request.param == "sigint ignored" else signal.default_int_handler
    previous = signal.signal(signal.SIGINT, disposition)
    yield request.param
    signal.signal(signal.SIGINT, previous)


def test_a_signalled_job_checkpoints_and_is_requeued_resuming_from_last_ckpt(tmp_path, capsys, monkeypatch, in_thread, sigint):
    """submitit's preemption signal reaches the job: CellJob.checkpoint() stops the fit, submitit
    requeues the same cell and the new start gets --ckpt_path (LocalExecutor restarts it)."""
    fake(monkeypatch)
    root = tmp_path / "runs"
    g = {"root": str(root), "configs": [DEMO], "seeds": [1], "variants": [{"name": "a"}]}
    path = write_grid(tmp_path / "grid.yaml", g)
    run = root / "a" / "seed1"
    thread, result = in_thread([str(path), "--executor", "submitit-local"])
    wait_for(lambda: (run / "checkpoints" / "last.ckpt").is_file() and "pid" in executors.read_json(run / "sweep.run"), "a start")
    fit = executors.read_json(run / "sweep.run")["pid"]
    status = Path(f"/proc/{fit}/status").read_text()
    ignored = int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)
    assert ignored >> (signal.SIGUSR2 - 1) & 1  # the fit ignores the signal; the job handles it
    job_process = int(Path(f"/proc/{fit}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(job_process, signal.SIGUSR2)  # what SLURM sends before a time limit
    thread.join(timeout=120)
    assert result.get("code") == 0, capsys.readouterr().err
    log = (run / "sweep.log").read_text()
    assert "stopped by SIGINT" in log
    starts = [line for line in log.splitlines() if line.startswith("# ")]
    assert len(starts) == 2 and "--ckpt_path" not in starts[0] and f"--ckpt_path {run}/checkpoints/last.ckpt" in starts[1]
    job_id = executors.read_json(run / "sweep.job")["job_id"]
    assert "Requeued job" in (root / ".submitit" / f"{job_id}_0_log.out").read_text()
    assert executors.read_json(run / "sweep.run")["exit"] == 0


def test_a_rerun_follows_a_job_still_running_instead_of_submitting_it_again(tmp_path, capsys, monkeypatch, in_thread):
    """After a logout (the sweep gone, its job not), the same command follows the job of sweep.job."""
    fake(monkeypatch)
    root = tmp_path / "runs"
    g = {"root": str(root), "configs": [DEMO], "overrides": {"wait_for": str(tmp_path / "go")}, "seeds": [1]}
    path = write_grid(tmp_path / "grid.yaml", {**g, "variants": [{"name": "a"}]})
    run = root / "a" / "seed1"
    (cell,) = sweep.load_grid(path)
    job_id = executors.SubmititRunner("submitit-local", root / ".submitit", {}, sweep.fit_command, print).submit(cell).job_id
    wait_for(lambda: "pid" in executors.read_json(run / "sweep.run"), "the job's fit")
    thread, result = in_thread([str(path), "--executor", "submitit-local"])
    err, end = "", time.monotonic() + 60
    try:
        while f"[1/1] a/seed1: job {job_id} submitted earlier is running: following it\n" not in err:
            assert thread.is_alive() and time.monotonic() < end, err
            time.sleep(0.05)
            err += capsys.readouterr().err
    finally:
        (tmp_path / "go").touch()  # the fakes end, whatever happened
    thread.join(timeout=60)
    err += capsys.readouterr().err
    assert result.get("code") == 0, err
    assert "submitted as" not in err and "seqvae sweep: [1/1] a/seed1: done in " in err
    assert executors.read_json(run / "sweep.job")["job_id"] == job_id and (run / "metrics.json").is_file()
    assert sum(line.startswith("# ") for line in (run / "sweep.log").read_text().splitlines()) == 1  # started once


# ------------------------------------------------------------------------------------- SLURM, mocked
def test_slurm_path_with_submitits_mocked_cluster(tmp_path, capsys, monkeypatch, keep_signals, in_thread):
    """sbatch and sacct are submitit's mocks: the sweep writes each cell's sbatch script from the
    grid's resources and the command line, stores the job id, submits a cell that needs another
    after it finished, and follows the jobs, which this test runs as the cluster would."""
    fake(monkeypatch)
    monkeypatch.setenv("SUBMITIT_FOLDER", "unset")
    root = tmp_path / "runs"
    g = {
        "root": str(root),
        "configs": [DEMO],
        "overrides": {"trainer.max_epochs": 2, "finish": True},
        "seeds": [1],
        "slurm": {"partition": "gpu", "timeout_min": 60, "mem_gb": 16, "cpus_per_task": 4},
        "variants": [{"name": "a"}, {"name": "dep", "needs": ["a"], "slurm": {"gpus_per_node": 2}}],
    }
    path = write_grid(tmp_path / "grid.yaml", g)
    folder = root / ".submitit"
    mock = MockedSubprocess(known_cmds=["srun", "sacct", "sbatch"])
    try:
        with mock.context():
            thread, result = in_thread([str(path), "--executor", "slurm", "--slurm.account", "proj"])
            wait_for(lambda: (root / "a" / "seed1" / "sweep.job").is_file(), "a submitted")
            assert executors.read_json(root / "a" / "seed1" / "sweep.job")["job_id"] == "12"
            sbatch = (folder / "12_submission.sh").read_text()
            for flag in ("partition=gpu", "account=proj", "time=60", "mem=16GB", "cpus-per-task=4", "job-name=a-seed1"):
                assert f"#SBATCH --{flag}\n" in sbatch
            assert "#SBATCH --signal=USR2@90\n" in sbatch and "gpus-per-node" not in sbatch and "ntasks-per-node=1\n" in sbatch
            mock.set_job_state("12", "PENDING")
            assert sweep.main([str(path), "--status"]) == 0
            status = capsys.readouterr().out.splitlines()
            assert status[1].split() == ["a/seed1", "queued", "slurm", "12"] and status[2].split() == [
                "dep/seed1",
                "not",
                "started",
            ]
            assert not (root / "dep").exists()  # needs a: not submitted yet

            mock.set_job_state("12", "RUNNING")
            with mock.job_context("12"):
                submission.process_job(folder)  # the job, as sbatch would run it
            mock.set_job_state("12", "COMPLETED")
            wait_for(lambda: (root / "dep" / "seed1" / "sweep.job").is_file(), "dep submitted")
            sbatch = (folder / "13_submission.sh").read_text()
            assert "#SBATCH --gpus-per-node=2\n" in sbatch and "#SBATCH --ntasks-per-node=2\n" in sbatch
            delayed = submission.utils.DelayedSubmission.load(folder / "13_submitted.pkl")
            gpu = [
                "--trainer.accelerator",
                "gpu",
                "--trainer.devices",
                "2",
                "--trainer.num_nodes",
                "1",
                "--trainer.strategy",
                "ddp",
            ]
            assert delayed.function.extra_args == gpu  # the fake fit ignores them: its rank 0 runs here
            with mock.job_context("13"):
                submission.process_job(folder)
            mock.set_job_state("13", "COMPLETED")
            thread.join(timeout=120)
    finally:
        SlurmJob.watcher.clear()
    out, err = capsys.readouterr()
    assert result.get("code") == 0, err
    assert "seqvae sweep: [2/2] dep/seed1: submitted as slurm job 13" in err and "seqvae sweep: 2 cells (2 ran) in " in err
    assert (root / "dep" / "seed1" / "metrics.json").is_file()
    assert "| name=a | 1 | 1.00 |" in out and "| name=dep | 1 | 1.00 |" in out  # the compare table


def test_ddp_cell_parameters(tmp_path):
    """A cell asking for G GPUs on N nodes: one task per GPU, and the fit told so (DDP)."""
    cell = Cell(1, 1, "big", 3, tmp_path / "big" / "seed3", [])
    resources = {"gpus_per_node": 4, "nodes": 2, "partition": "a100", "timeout_min": 90, "qos": "high"}
    params = executors.executor_parameters("slurm", cell, resources)
    assert params == {
        "name": "big-seed3", "timeout_min": 90, "nodes": 2, "gpus_per_node": 4, "tasks_per_node": 4,
        "slurm_partition": "a100", "slurm_qos": "high",
    }  # fmt: skip
    assert executors.fit_device_args(resources)[-6:] == [
        "--trainer.devices",
        "4",
        "--trainer.num_nodes",
        "2",
        "--trainer.strategy",
        "ddp",
    ]
    assert executors.fit_device_args({"gpus_per_node": 1}) == [
        "--trainer.accelerator",
        "gpu",
        "--trainer.devices",
        "1",
        "--trainer.num_nodes",
        "1",
    ]
    assert executors.fit_device_args({}) == []  # a CPU cell keeps its config's devices
    with MockedSubprocess(known_cmds=["srun"]).context():
        executor = executors.make_executor("slurm", tmp_path / "jobs", cell, resources)
    inner = executor._executor.parameters
    assert (inner["ntasks_per_node"], inner["gpus_per_node"], inner["nodes"], inner["time"]) == (4, 4, 2, 90)
    assert executor._executor.max_num_timeout == executors.REQUEUES
    local = executors.executor_parameters("submitit-local", cell, resources)
    assert local["tasks_per_node"] == 1 and "slurm_partition" not in local  # Lightning's own launcher there


# ------------------------------------------------------------------------------------- --status
def test_status_states_from_the_run_directories(tmp_path, capsys):
    root = tmp_path / "runs"
    names = ["done", "failed", "interrupted", "running", "reused", "queued", "new"]
    g = {"root": str(root), "configs": [DEMO], "seeds": [1], "variants": [{"name": n} for n in names]}
    path = write_grid(tmp_path / "grid.yaml", g)
    run = {n: root / n / "seed1" for n in names}
    for d in run.values():
        d.mkdir(parents=True)
    (run["done"] / "metrics.json").write_text(json.dumps({"epochs": 3, "test/iw_nll": 91.23456}))
    (run["done"] / "config.yaml").write_text("trainer: {max_epochs: 3}\n")
    executors.write_json(run["failed"] / "sweep.job", {"executor": "local", "job_id": "999999999", "host": "h"})
    executors.write_json(run["failed"] / "sweep.run", {"job_id": "999999999", "started": "x", "ended": "y", "exit": 2})
    (run["interrupted"] / "checkpoints").mkdir()
    (run["interrupted"] / "config.yaml").write_text("trainer: {max_epochs: 20}\n")
    progress = {"current": {"processed": 7}, "is_last_batch": False}
    score = {"monitor": "val/loss", "current_score": torch.tensor(95.3124)}
    ckpt = {"epoch": 1, "loops": {"fit_loop": {"epoch_loop.batch_progress": progress}}, "callbacks": {"ModelCheckpoint{}": score}}
    torch.save(ckpt, run["interrupted"] / "checkpoints" / "last.ckpt")
    executors.write_json(run["interrupted"] / "sweep.job", {"executor": "local", "job_id": "999999999", "host": "h"})
    executors.write_json(run["interrupted"] / "sweep.run", {"job_id": "999999999", "exit": "interrupted"})  # Ctrl-C'd sweep
    me = {"executor": "local", "job_id": str(os.getpid()), "host": executors.socket.gethostname()}
    executors.write_json(run["running"] / "sweep.job", {**me, "pid_start": executors.proc_start(os.getpid())})
    executors.write_json(run["reused"] / "sweep.job", {**me, "pid_start": "1"})  # this pid, but another process
    executors.write_json(run["queued"] / "sweep.job", {"executor": "slurm", "job_id": "77", "folder": str(tmp_path)})
    mock = MockedSubprocess(known_cmds=["sacct"])
    mock.set_job_state("77", "PENDING")
    try:
        with mock.context():
            assert sweep.main([str(path), "--status"]) == 0
    finally:
        SlurmJob.watcher.clear()
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[1] == ["done/seed1", "done", "3/3", "test/iw_nll", "91.235"]
    assert rows[2] == ["failed/seed1", "failed", "(exit", "2)", "local", "999999999"]
    assert rows[3] == ["interrupted/seed1", "interrupted", "2/20,", "batch", "7", "val/loss", "95.312", "local", "999999999"]
    assert rows[4] == ["running/seed1", "running", "local", str(os.getpid())]
    assert rows[5] == ["reused/seed1", "failed", "local", str(os.getpid())]
    assert rows[6] == ["queued/seed1", "queued", "slurm", "77"]
    assert rows[7] == ["new/seed1", "not", "started"]
    assert rows[8] == "7 cells: 1 done, 2 failed, 1 interrupted, 1 running, 1 queued, 1 not started".split()


def test_slurm_options_are_checked_with_one_line_errors(tmp_path, capsys, monkeypatch):
    g = {"root": str(tmp_path / "runs"), "configs": [DEMO], "seeds": [1], "variants": [{"name": "a"}]}
    path = write_grid(tmp_path / "grid.yaml", g)
    cases = [
        (["--executor", "slurm", "--slurm.mem_gb", "lots"], "--slurm.mem_gb: expected a positive number, got 'lots'"),
        (["--executor", "slurm", "--slurm.gpus_per_node", "-1"], "--slurm.gpus_per_node: expected an integer >= 0, got -1"),
        (["--executor", "slurm", "--slurm.timeout_min", "1.5"], "--slurm.timeout_min: expected an integer >= 1, got '1.5'"),
        (["--slurm.partition", "gpu"], "--slurm.partition: only with --executor slurm or submitit-local"),
        (["--executor", "slurm"], "--executor slurm: no sbatch on this machine (run it on a SLURM login node)"),
    ]
    monkeypatch.setattr(sweep.shutil, "which", lambda name: None)  # not a SLURM login node, wherever the tests run
    for args, message in cases:
        assert sweep.main([str(path), *args]) == 2
        assert capsys.readouterr().err == f"seqvae sweep: error: {message}\n"
