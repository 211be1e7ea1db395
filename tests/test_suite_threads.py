"""The suite runs one torch thread per process unless the caller set OMP_NUM_THREADS (conftest.py:
its tiny networks, in process and in the CLI processes it starts, spun at a thread per core beside
other work). The pytest process's own count is not asserted here: `seqvae probe` run in process
lowers it on purpose (`analysis/probe.py`, `--threads`)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_processes_the_suite_starts_run_the_threads_the_variable_names():
    threads = int(os.environ["OMP_NUM_THREADS"])
    child = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True, check=True
    )
    assert int(child.stdout) == threads


def test_conftest_sets_one_thread_only_where_the_caller_set_none():
    script = (
        "import os; os.environ.pop('OMP_NUM_THREADS', None); "
        "exec(open('tests/conftest.py').read()); print(os.environ['OMP_NUM_THREADS'])"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    unset = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=root)
    assert unset.stdout.strip() == "1"
    kept = script.replace("os.environ.pop('OMP_NUM_THREADS', None)", "os.environ['OMP_NUM_THREADS'] = '3'")
    assert (
        subprocess.run([sys.executable, "-c", kept], capture_output=True, text=True, check=True, cwd=root).stdout.strip() == "3"
    )
