"""Peak RSS of `seqvae test` against the number of test texts (a benchmark, not a test).

    python -m benchmarks.memory [--k 100] [--sizes 1000,2000,5000,10000] [--run DIR] [--pythonpath DIR]

First trains a throw-away yahoo10k max-pooled checkpoint (emb 64, LSTM 128, z 32, 5,004 ids;
10 training batches: the trained values do not matter for memory) unless --run names an
existing run directory, then runs, one after the other,

    seqvae test --config RUN/config.yaml --ckpt_path RUN/checkpoints/last.ckpt \
        --data.test ../shared/data/yahoo/valid.txt#1-N --model.test_iw_samples K

for each N, each in its own process with OMP_NUM_THREADS=1, and prints its peak RSS (the child's
ru_maxrss from wait4), wall time and the metrics it wrote (mi_dataset and iw_nll: two versions
of the code must agree on them). The test text is read in place, never copied. --pythonpath puts
another copy of the package first on the import path (e.g. the pre-change code, to measure
"before"). IW-NLL at K = 100 costs minutes per 1,000 texts on one core; its memory does not depend
on N (one batch at a time), the dataset MI's does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = "../shared/data/yahoo/valid.txt"  # relative to the repository root, as the configs have it
CONFIGS = ["--config", "configs/yahoo10k/base.yaml", "--config", "configs/yahoo10k/max.yaml"]


def seqvae(args: list[str], env: dict, log: Path) -> tuple[int, float, float]:
    """Runs `seqvae ARGS` (this interpreter, so --pythonpath applies); (exit code, peak RSS in
    bytes, wall seconds). wait4 gives this child's own rusage, not a maximum over all children."""
    # -P: `-c` would put the working directory (the repository root) first on sys.path, over --pythonpath
    cmd = [sys.executable, "-P", "-c", "import sys; from seqvae.commands import main; sys.argv[0] = 'seqvae'; main()", *args]
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024, time.perf_counter() - start  # ru_maxrss: KiB on Linux


def newest(pattern: str, under: Path) -> Path | None:
    found = sorted(under.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", type=int, default=100, help="importance samples (--model.test_iw_samples)")
    p.add_argument("--sizes", default="1000,2000,5000,10000", help="numbers of test texts, comma-separated")
    p.add_argument("--run", type=Path, help="an existing run directory (config.yaml, checkpoints/last.ckpt)")
    p.add_argument("--workdir", type=Path, help="where runs go (default: a new temporary directory)")
    p.add_argument("--pythonpath", type=Path, help="import seqvae from this directory instead")
    p.add_argument("--extra", default="", help="more `seqvae test` arguments, space-separated")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([str(args.pythonpath.resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_memory_"))
    work.mkdir(parents=True, exist_ok=True)
    where = [sys.executable, "-P", "-c", "import seqvae; print(seqvae.__file__)"]
    code = subprocess.run(where, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip()
    print(f"{os.cpu_count()} CPU cores, 1-min load average {os.getloadavg()[0]:.2f}; code {Path(code).parent}; "
          f"runs and logs in {work}", flush=True)  # fmt: skip
    run = args.run
    if run is None:
        fit = [*CONFIGS, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "10",
               "--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "1", "--model.test_iw_samples", "0",
               "--trainer.logger.init_args.save_dir", str(work / "fit")]  # fmt: skip
        rc, rss, wall = seqvae(["fit", *fit], env, work / "fit.log")
        run = newest("*/*/checkpoints/last.ckpt", work / "fit")
        if rc != 0 or run is None:
            print(f"fit failed (exit {rc}); see {work / 'fit.log'}", file=sys.stderr)
            return 1
        run = run.parent.parent
        print(f"checkpoint: {run} (fit: {rss / 1e9:.2f} GB peak RSS, {wall:.0f} s)", flush=True)
    print(f"{'texts':>6} {'K':>4} {'peak RSS':>10} {'wall':>8}  {'mi_dataset':>12} {'iw_nll':>12}  exit", flush=True)
    for n in [int(s) for s in args.sizes.split(",")]:
        out = work / f"test_{n}_k{args.k}"
        test = ["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                "--data.test", f"{TEXT}#1-{n}", "--model.test_iw_samples", str(args.k),
                "--trainer.limit_test_batches", "1.0", "--trainer.logger.init_args.save_dir", str(out),
                *args.extra.split()]  # fmt: skip
        rc, rss, wall = seqvae(test, env, work / f"test_{n}_k{args.k}.log")
        metrics_file = newest("**/metrics.json", out)
        m = json.loads(metrics_file.read_text()) if rc == 0 and metrics_file else {}
        # metrics.json keys may carry a "test/" prefix
        get = lambda key: m.get(key, m.get(f"test/{key}", float("nan")))  # noqa: E731
        print(f"{n:>6} {args.k:>4} {rss / 1e9:>7.2f} GB {wall:>6.0f} s  {get('mi_dataset'):>12.6f} "
              f"{get('iw_nll'):>12.4f}  {rc}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
