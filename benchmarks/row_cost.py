"""CPU seconds per training step of the Table-1 rows that change the step, against `last`:
iVAE and iVAE_MI (DualKL's critic steps inside each training step), WAE-RNF (a planar flow, MMD and
centres penalties) and SA-VAE (10 SVI steps, double backward), issues 48 and 49.

    python -m benchmarks.row_cost [--dataset yahoo10k] [--rows last,ivae,ivae_mi,wae_rnf,sa_vae]
                                  [--steps 3] [--warm 1] [--json PATH]

Each row's model is built by the CLI from its own config, `configs/<dataset>/base.yaml` +
`configs/<dataset>/<row>.yaml` (`SeqVAECLI(run=False)`: exactly what `seqvae fit` would train, its
optimiser included), and trained through `Trainer.fit` by `benchmarks/trainer_path.timed_fit` (the
model's own `training_step`) on the same real batches: the first `warm + steps` batches of the
training loader's first epoch (the bucket sampler's, seed 1), `warm` of them untimed. One torch
thread; each row in a child process of its own (start-up and allocator state do not carry over).
Wall and process-CPU seconds per step, the CPU time also as a multiple of `last`'s, with the load
average: on a shared machine compare CPU seconds. Run from the repository root (the configs' data
paths are relative to it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROWS = ("last", "ivae", "ivae_mi", "wae_rnf", "sa_vae")


def measure(dataset: str, row: str, steps: int, warm: int) -> dict:
    """One row, in this process: the CLI-built model, timed through Trainer.fit on the loader's first batches."""
    import torch

    threads = torch.get_num_threads()  # restored: a caller in the same process (a test) keeps its own count
    torch.set_num_threads(1)
    try:
        return _measure(dataset, row, steps, warm)
    finally:
        torch.set_num_threads(threads)


def _measure(dataset: str, row: str, steps: int, warm: int) -> dict:
    import torch

    from benchmarks.trainer_path import timed_fit
    from seqvae.cli import SeqVAECLI

    with tempfile.TemporaryDirectory() as tmp:
        args = ["--config", f"configs/{dataset}/base.yaml", "--config", f"configs/{dataset}/{row}.yaml"]
        cli = SeqVAECLI(args=[*args, "--trainer.logger.init_args.save_dir", tmp], run=False)
        cli.datamodule.setup("fit")
        batches = []
        for batch in cli.datamodule.train_dataloader():
            batches.append(batch)
            if len(batches) == warm + steps:
                break
        result = timed_fit(cli.model, batches, warm, torch.device("cpu"))
    shape = [tuple(b["tokens"].shape) for b in batches[warm:]]
    model = cli.model  # which strategies the row's config switched on: what was timed
    strategies = {k: type(getattr(model, k, None)).__name__ for k in ("kl_penalty", "refine")}
    strategies["posterior"] = type(model.encoder.posterior).__name__
    return {"row": row, "config": f"configs/{dataset}/{row}.yaml", "batches": shape, "strategies": strategies, **result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="yahoo10k", help="configs/<dataset>/ holds base.yaml and the rows' configs")
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated config names (last first: the multiple's base)")
    ap.add_argument("--steps", type=int, default=3, help="timed training steps per row")
    ap.add_argument("--warm", type=int, default=1, help="untimed steps before them (the same shapes)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one row, measured in this process, JSON on stdout
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(measure(a.dataset, a.child, a.steps, a.warm)))
        return 0
    rows = [r for r in a.rows.split(",") if r]
    missing = [f"configs/{a.dataset}/{r}.yaml" for r in rows if not os.path.isfile(f"configs/{a.dataset}/{r}.yaml")]
    if missing:
        print(f"row_cost: error: no such config: {', '.join(missing)} (run from the repository root)", file=sys.stderr)
        return 2
    env = dict(os.environ, OMP_NUM_THREADS="1")
    print(
        f"load average before: {os.getloadavg()}, cores: {os.cpu_count()}, one torch thread, {a.warm} + {a.steps} steps per row"
    )
    print("| row | config | batches (B × T) | wall s/step | CPU s/step | CPU × last |")
    print("|---|---|---|---|---|---|")
    results, base = [], None
    for row in rows:
        cmd = [sys.executable, "-m", "benchmarks.row_cost", "--dataset", a.dataset, "--child", row]
        cmd += ["--steps", str(a.steps), "--warm", str(a.warm)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode:
            print(f"row_cost: error: {row} failed (rc {p.returncode}): {p.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return 1
        r = json.loads(p.stdout.strip().splitlines()[-1])
        r["loadavg_1min"] = os.getloadavg()[0]
        base = base or r["cpu_s_per_step"]
        r["cpu_x_first_row"] = r["cpu_s_per_step"] / base
        shapes = ", ".join(f"{b}×{t}" for b, t in r["batches"])
        print(
            f"| {row} | {r['config']} | {shapes} | {r['s_per_step']:.3f} | {r['cpu_s_per_step']:.3f} | "
            f"{r['cpu_x_first_row']:.1f} |",
            flush=True,
        )
        results.append(r)
    print(f"load average after: {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"dataset": a.dataset, "steps": a.steps, "warm": a.warm, "rows": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
