"""scripts/table1_rest_grid.sh (issue 48's grids) with a stand-in python that records its calls: the sweep once with
the user's options, then both WAE-RNF estimators per text for each exported cell that lacks them, written whole."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(tmp_path: Path, fail_rnf: bool = False) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    export = tmp_path / "export"
    for seed, files in {1: ["metrics.json"], 2: ["metrics.json", "rnf_nll.csv"], 3: []}.items():
        cell = export / "wae_rnf" / f"seed{seed}"
        cell.mkdir(parents=True)
        for name in files:
            (cell / name).write_text("x\n")
    (export / "ivae_sgd" / "seed1").mkdir(parents=True)
    (export / "ivae_sgd" / "seed1" / "metrics.json").write_text("x\n")
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"# a grid\nroot: {tmp_path / 'runs'}\nexport: {export}\nseeds: [1, 2, 3]\n")
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    # the stand-in writes the --per-text file (its last argument) as rnf-nll does, or fails half-way through it
    write = 'echo "index,iw_nll,reference_iw_nll" > "$last"' + ("; exit 3" if fail_rnf else "")
    fake.write_text(f'#!/bin/bash\necho "$OMP_NUM_THREADS $*" >> {log}\nlast="${{@: -1}}"\n'
                    f'if [ "$3" = rnf-nll ]; then {write}; fi\n')  # fmt: skip
    fake.chmod(0o755)
    proc = subprocess.run(
        ["bash", "scripts/table1_rest_grid.sh", str(grid), "--variants", "wae_rnf", "--seeds", "1,2"],
        cwd=REPO, env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc, log.read_text().splitlines(), export


def test_sweep_then_rnf_estimators_for_the_cells_lacking_them(tmp_path):
    proc, calls, export = run_script(tmp_path)
    assert proc.returncode == 0, proc.stderr
    cell = export / "wae_rnf" / "seed1"
    assert calls == [
        f"1 -m seqvae sweep {tmp_path / 'grid.yaml'} --jobs 2 --variants wae_rnf --seeds 1,2",
        f"1 -m seqvae rnf-nll {tmp_path / 'runs' / 'wae_rnf' / 'seed1'} --samples 100 --per-text {cell}/rnf_nll.csv.part",
    ]
    assert (cell / "rnf_nll.csv").read_text().startswith("index,iw_nll,reference_iw_nll")
    assert not (cell / "rnf_nll.csv.part").exists()
    assert (export / "wae_rnf" / "seed2" / "rnf_nll.csv").read_text() == "x\n"  # one already there is kept


def test_an_interrupted_estimate_leaves_no_file_a_rerun_would_skip(tmp_path):
    proc, calls, export = run_script(tmp_path, fail_rnf=True)
    assert proc.returncode != 0
    assert not (export / "wae_rnf" / "seed1" / "rnf_nll.csv").exists()


def test_a_grid_without_root_or_export_is_refused_before_running(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("seeds: [1]\n")
    log = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", "scripts/table1_rest_grid.sh", str(grid)], cwd=REPO,
                          env={**os.environ, "PYTHON": str(fake)}, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2 and "root: and export:" in proc.stderr
    assert not log.exists()
