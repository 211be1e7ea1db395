"""How loose the IW-NLL is against AIS, per model, from `seqvae test` run directories (docs/ais.md):

    python scripts/ais_gap.py RUN_DIR [RUN_DIR …]

Each RUN_DIR is a `seqvae test --ckpt_path C …` directory (its metrics.json and per_text.csv; the
highest-numbered set when a directory holds several). Runs of the same checkpoint are one model:
each IW-NLL (one per K) is paired per text with the model's AIS-NLL, over the texts both scored,
and the table gives the mean of IW-NLL − AIS-NLL with its 95% t-interval across texts, the mean
AIS Monte-Carlo s.e. per text (across its chains), the chains' acceptance rate and the AIS seconds
per text. A positive gap: the IW bound is looser than AIS's by that much on these texts.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from seqvae.analysis.differences import t_interval


def latest(run: Path, stem: str, suffix: str) -> Path:
    """metrics.json / per_text.csv, or the highest-numbered metrics-N.json / per_text-N.csv."""
    numbered = sorted(run.glob(f"{stem}-*{suffix}"), key=lambda p: int(p.stem.rpartition("-")[2]))
    return numbered[-1] if numbered else run / f"{stem}{suffix}"


def read_run(run: Path) -> dict:
    metrics = json.loads(latest(run, "metrics", ".json").read_text())
    with open(run / metrics["per_text_file"], newline="") as f:
        rows = {int(r["index"]): r for r in csv.DictReader(f)}
    return {"path": run, "metrics": metrics, "rows": rows}


def table(runs: list[dict]) -> str:
    models: dict[str, list[dict]] = {}
    for run in runs:
        models.setdefault(str(run["metrics"].get("checkpoint")), []).append(run)
    out = [
        "| checkpoint | K | texts | IW-NLL | AIS-NLL | IW − AIS [95% CI] | AIS se per text (mean) | accept | AIS s/text |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ckpt, group in models.items():
        ais = [r for r in group if "test/ais_nll" in r["metrics"]]
        if not ais:
            print(f"ais_gap: {ckpt}: no run with AIS (model.ais) among {[str(r['path']) for r in group]}", file=sys.stderr)
            continue
        a = ais[0]
        for run in sorted(group, key=lambda r: r["metrics"]["iw_samples"]):
            common = sorted(set(run["rows"]) & set(a["rows"]))
            iw = [float(run["rows"][i]["iw_nll"]) for i in common]
            est = [float(a["rows"][i]["ais_nll"]) for i in common]
            se = [float(a["rows"][i]["ais_se"]) for i in common]
            gap = t_interval([x - y for x, y in zip(iw, est)])
            ci = f"{gap['diff']:.2f} [{gap['lo']:.2f}, {gap['hi']:.2f}]" if gap["lo"] is not None else f"{gap['diff']:.2f}"
            m = a["metrics"]
            out.append(
                f"| {Path(ckpt).parents[2].name}/{Path(ckpt).parents[1].name} | {run['metrics']['iw_samples']} "
                f"| {len(common)} | {sum(iw) / len(iw):.2f} | {sum(est) / len(est):.2f} | {ci} | {sum(se) / len(se):.3f} "
                f"| {m['test/ais_accept']:.2f} | {m['test/ais_seconds_per_text']:.1f} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print(table([read_run(r) for r in args.runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
