"""Each method's gap to a baseline of the same seed: metric(method, seed) - metric(baseline, seed).

    python scripts/paired_gap.py docs/results/yahoo10k_short [--baseline lm] [--metric test/iw_nll]

Reads DIR/<variant>/seed<N>/metrics.json. The seed sets the initial weights and the order of
the batches for every method alike, so part of the spread over seeds is shared: on
yahoo10k-short the LSTM-LM alone spans 415.4-418.1 nats over seeds 1-3. A paired gap removes
that shared part; its mean ± s.d. (sample s.d., as `seqvae compare`) over the seeds both runs
have is printed as a Markdown table next to the unpaired s.d. of the method's own metric.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path


def read(root: Path, metric: str) -> dict[str, dict[int, float]]:
    """variant -> seed -> metric, for the runs that have the metric."""
    values: dict[str, dict[int, float]] = {}
    for path in sorted(root.glob("*/seed*/metrics.json")):
        seed = re.fullmatch(r"seed(\d+)", path.parent.name)
        if seed is None:
            continue
        try:
            metrics = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise SystemExit(f"paired_gap: error: {path}: not valid JSON ({err.msg}, line {err.lineno})") from err
        if isinstance(metrics.get(metric), (int, float)):
            values.setdefault(path.parent.parent.name, {})[int(seed.group(1))] = float(metrics[metric])
    return values


def gaps(values: dict[str, dict[int, float]], baseline: str) -> list[dict]:
    """One row per variant (but the baseline) with at least one seed in common with it."""
    if baseline not in values:
        raise SystemExit(f"paired_gap: error: --baseline {baseline}: no run of it has the metric")
    base, rows = values[baseline], []
    for variant, runs in sorted(values.items()):
        seeds = sorted(set(runs) & set(base))
        if variant == baseline or not seeds:
            continue
        diff = [runs[s] - base[s] for s in seeds]
        own = [runs[s] for s in seeds]
        rows.append(
            {
                "variant": variant,
                "seeds": seeds,
                "gaps": diff,
                "mean": statistics.fmean(diff),
                "std": statistics.stdev(diff) if len(diff) > 1 else None,
                "unpaired_std": statistics.stdev(own) if len(own) > 1 else None,
            }
        )
    return rows


def render(rows: list[dict], baseline: str, metric: str) -> str:
    def sd(x):
        return "–" if x is None else f"{x:.2f}"

    lines = [
        f"| run | n | {metric} − {baseline} (same seed) | per seed | s.d. of {metric} itself |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        mean = f"{r['mean']:+.2f}" + ("" if r["std"] is None else f" ± {r['std']:.2f}")
        per_seed = ", ".join(f"{s}: {g:+.2f}" for s, g in zip(r["seeds"], r["gaps"]))
        lines.append(f"| {r['variant']} | {len(r['seeds'])} | {mean} | {per_seed} | {sd(r['unpaired_std'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, metavar="DIR", help="holds <variant>/seed<N>/metrics.json")
    parser.add_argument("--baseline", default="lm", help="the variant subtracted (default lm)")
    parser.add_argument("--metric", default="test/iw_nll", help="a metrics.json key (default test/iw_nll)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root}: not a directory")
    sys.stdout.write(render(gaps(read(args.root, args.metric), args.baseline), args.baseline, args.metric))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
