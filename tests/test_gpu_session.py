"""The CPU dry run of scripts/gpu_session.sh (issue 46): the GPU session's exact arguments, on the
CPU at toy sizes, in a copy of the tree with no ../shared beside it and only what `prepare`
puts under .gpu/ (here a stand-in for the Yahoo copy: 10,000 lines, as the splits read).
The first GPU session has one call and no retry: whatever it reads must be in the tree."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from test_model import write_corpus

ROOT = Path(__file__).resolve().parents[1]


def copy_of_the_tree(dest: Path) -> Path:
    """The files git would send (tracked and untracked-not-ignored), nothing else."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_the_dry_run_passes_in_a_tree_without_shared_data(tmp_path):
    tree = copy_of_the_tree(tmp_path / "tree")
    assert not (tmp_path / "shared").exists()
    (tree / ".gpu/yahoo").mkdir(parents=True)
    write_corpus(tree / ".gpu/yahoo/valid.txt", 10_000, 0, min_len=4, max_len=12)
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)  # the script puts the copy first, as on the GPU machine
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "run"], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    session = (out / "session.log").read_text() if (out / "session.log").exists() else ""
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pre-flight passed (cpu)" in session
    assert "done: 4 of 4 fits finished" in session, session + (out / "fits.log").read_text()
    for m in ("max", "last"):
        for seed in (1, 2):
            metrics = json.loads((tree / f"runs/gpu/{m}/paper_seed{seed}/metrics.json").read_text())
            assert metrics["epochs"] == 12  # the 10-epoch warm-up and 2 at full weight
            assert metrics["provenance"]["command"].count(".gpu/yahoo/valid.txt#") == 3  # train, val, test from the copy
    probe = json.loads((out / "probe.json").read_text())
    assert [r["mode"] for r in probe["train"]] == ["default", "tf32", "bf16", "tf32"]
    # bf16-mixed on the CPU runs the LSTM through oneDNN, which fails on a CPU without AVX-512 (an AMD EPYC with AVX2
    # only, 2026-12-07: "could not create a primitive descriptor"); the probe records that figure's error and goes on
    cpu_bf16 = [r for r in probe["train"] if "error" in r]
    assert all(r["mode"] == "bf16" and "RuntimeError" in r["error"] for r in cpu_bf16), cpu_bf16
    assert all(r["tokens_per_s"] > 0 and r["host_reads_per_step"] >= 0 for r in probe["train"] if "error" not in r)
    assert [r["K"] for r in probe["iw"]] == [5, 5, 5]
    assert probe["iw"][0]["mean_iw_nll"] == probe["iw"][1]["mean_iw_nll"] or abs(
        probe["iw"][0]["mean_iw_nll"] - probe["iw"][1]["mean_iw_nll"]
    ) < 1e-3  # the chunking changes the speed, not the value
    assert (out / "fits.log").read_text().count("seqvae: epoch 12/12") == 4


def test_a_missing_data_copy_stops_the_session_in_one_line(tmp_path):
    tree = copy_of_the_tree(tmp_path / "tree")
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "run"], cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stdout.strip().endswith("STOP: .gpu/yahoo/valid.txt missing: run scripts/gpu_session.sh prepare here and carry .gpu")
    assert not (tree / "runs").exists()
