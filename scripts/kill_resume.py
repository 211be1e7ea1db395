"""Kill-and-resume equality on the demo corpus.

1. An uninterrupted `seqvae fit` (2 epochs of 40 batches, a mid-epoch checkpoint every 10 batches).
2. The same fit again, SIGKILLed in epoch 1 once its mid-epoch checkpoint after batch 10 is on disk.
3. `seqvae fit ... --ckpt_path last` in the killed run's directory.
Prints the largest absolute difference between the parameters of runs 1 and 3 (0.0 expected:
bit-identical on CPU), where the kill happened, and the update counters.

    python scripts/kill_resume.py [--workdir runs/kill_resume] [--keep]

About a minute on 2 CPU cores. Runs in a temporary directory unless --workdir is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
EPOCHS, BATCHES, EVERY = 2, 40, 10


def fit_args(save_dir: Path, version: str) -> list[str]:
    return [
        sys.executable, "-m", "seqvae.cli", "fit", "--config", str(REPO / "configs" / "demo.yaml"),
        "--trainer.max_epochs", str(EPOCHS), "--trainer.limit_train_batches", str(BATCHES),
        "--model.test_iw_samples", "5", "--periodic_checkpoint.every_n_batches", str(EVERY),
        "--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.logger.init_args.version", version,
    ]  # fmt: skip


def run(cmd: list[str], log: Path) -> None:
    with log.open("w") as out:
        subprocess.run(cmd, check=True, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=ENV)


def position(path: Path) -> dict | None:
    """The (epoch, batches done) a last.ckpt was written at; None while there is none."""
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)  # atomic writes: never a partial file
    loader = state["loops"]["fit_loop"]["state_dict"].get("combined_loader") or [{}]
    return {**loader[0], "updates": state["seqvae"]["num_updates"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where the three runs go (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kill_resume-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        run(fit_args(work, "straight"), work / "straight.log")
        straight_dir = work / "demo" / "straight"

        killed_dir = work / "demo" / "killed"
        last = killed_dir / "checkpoints" / "last.ckpt"
        with (work / "killed.log").open("w") as out:
            proc = subprocess.Popen(fit_args(work, "killed"), stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=ENV)
            at = None
            while proc.poll() is None:
                at = position(last)
                if at and at.get("epoch") == 1 and at.get("batches", 0) >= EVERY:
                    break
                time.sleep(0.02)
            if proc.poll() is not None:
                print(f"the second fit ended before it could be killed (exit {proc.returncode})", file=sys.stderr)
                return 1
            proc.kill()  # SIGKILL: no handler, no final checkpoint
            proc.wait()
        killed_at = position(last)

        run([*fit_args(work, "killed"), "--ckpt_path", "last"], work / "resumed.log")

        a = torch.load(straight_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        b = torch.load(last, map_location="cpu", weights_only=True)
        diff = max((a["state_dict"][k].double() - b["state_dict"][k].double()).abs().max().item() for k in a["state_dict"])
        same_keys = a["state_dict"].keys() == b["state_dict"].keys()
        ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (straight_dir, killed_dir))
        metrics_equal = all(ma[k] == mb[k] for k in ma if k.startswith("test/"))
        print(f"killed (SIGKILL, exit {proc.returncode}) in epoch {killed_at['epoch']} after its checkpoint at batch "
              f"{killed_at['batches']} of {BATCHES} (update {killed_at['updates']} of {EPOCHS * BATCHES})")  # fmt: skip
        print(f"updates: uninterrupted {ma['updates']}, killed+resumed {mb['updates']}")
        print(f"parameter tensors: {len(a['state_dict'])} (same names: {same_keys})")
        print(f"max |parameter difference|: {diff}")
        print(f"test metrics identical: {metrics_equal}")
        print(f"({time.monotonic() - start:.0f} s; runs in {work})")
        return 0 if diff == 0.0 and same_keys and metrics_equal else 1
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


_PATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": _PATH}

if __name__ == "__main__":
    sys.exit(main())
