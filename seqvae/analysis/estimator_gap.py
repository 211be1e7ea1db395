"""The gap between two estimates of one quantity on the same checkpoints, paired by text and by seed:
iVAE's NLL-bar against its IW-NLL (SPEC §11.5), WAE-RNF's published estimator against the correct
IW-NLL (SPEC §12.5; `seqvae rnf-nll RUN --per-text FILE` writes both per text).

    python -m seqvae.analysis.estimator_gap 'docs/results/yahoo10k_table1_rest/ivae*/seed*' --estimate nll_bar
    python -m seqvae.analysis.estimator_gap 'RUNS' --file rnf_nll.csv --estimate reference_iw_nll --bound iw_nll

Each run directory (metrics.json, and the per-text file: per_text.csv unless `--file`) gives, over the
texts where both columns are finite, the mean of each and mean(estimate − bound) ± t(0.975, N−1)·sd/√N
by text: the test texts' and the importance-sampling noise of that one checkpoint. Runs in one variant
directory (`<root>/<variant>/seed<N>`) then get mean(gap_s) ± t(0.975, S−1)·sd/√S over their seeds: the
training randomness the seeds varied too, the interval a claim about the method rests on. `*` marks an
interval that excludes 0.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys

from seqvae.analysis.compare import escape
from seqvae.analysis.differences import excludes_zero, t_interval
from seqvae.analysis.runs import MISSING, CompareError, find_runs


def read_columns(run: dict, file: str, columns: tuple[str, str]) -> tuple[list[float], list[float], int]:
    """The two columns over the texts where both are finite, and how many texts the file has."""
    path = run["path"] / file
    if not path.is_file():
        raise CompareError(f"{path}: no such file (the per-text values of {run['path']})")
    a, b, total = [], [], 0
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        absent = [c for c in columns if c not in (reader.fieldnames or [])]
        if absent:
            raise CompareError(f"{path}: no column {', '.join(absent)} (it has {','.join(reader.fieldnames or [])})")
        for line, row in enumerate(reader, start=2):
            total += 1
            try:
                x, y = float(row[columns[0]]), float(row[columns[1]])
            except (TypeError, ValueError):
                raise CompareError(f"{path}:{line}: not a number in {columns[0]} or {columns[1]}") from None
            if math.isfinite(x) and math.isfinite(y):
                a.append(x)
                b.append(y)
    return a, b, total


def interval_cell(d: dict, by: str) -> str:
    if d["diff"] is None:
        return MISSING
    if d["lo"] is None:
        return f"{d['diff']:+.2f} (n/a: one {by})"
    star = "*" if excludes_zero(d) else ""
    return f"{d['diff']:+.2f} [{d['lo']:+.2f}, {d['hi']:+.2f}]{star}"


def gaps(patterns: list[str], estimate: str, bound: str, file: str) -> list[dict]:
    """One entry per variant: its runs (each with its texts' means and by-text interval) and the by-seed interval."""
    variants: dict[str, dict] = {}
    for run in find_runs(patterns, program="estimator_gap"):
        a, b, total = read_columns(run, file, (estimate, bound))
        if not a:
            raise CompareError(f"{run['path'] / file}: no text has both {estimate} and {bound}")
        entry = {
            "run": str(run["path"]),
            "seed": run["seed"],
            "texts": len(a),
            "texts_in_file": total,
            estimate: sum(a) / len(a),
            bound: sum(b) / len(b),
            "by_text": t_interval([x - y for x, y in zip(a, b)]),
        }
        variants.setdefault(run["path"].parent.name, {"runs": []})["runs"].append(entry)
    for v in variants.values():
        v["by_seed"] = t_interval([r["by_text"]["diff"] for r in v["runs"]])
    return [{"variant": name, **v} for name, v in variants.items()]


def render(groups: list[dict], estimate: str, bound: str) -> str:
    lines = [
        f"| run | texts | {estimate} | {bound} | {estimate} − {bound} [95%] | paired by |",
        "|---" * 6 + "|",
    ]
    for g in groups:
        for r in g["runs"]:
            texts = f"{r['texts']}" + (f" of {r['texts_in_file']}" if r["texts"] != r["texts_in_file"] else "")
            name = f"{g['variant']}/seed{r['seed']}" if r["seed"] is not None else r["run"]
            cells = [escape(name), texts, f"{r[estimate]:.2f}", f"{r[bound]:.2f}", interval_cell(r["by_text"], "text"), "text"]
            lines.append("| " + " | ".join(cells) + " |")
        n = len(g["runs"])
        mean = lambda key: sum(r[key] for r in g["runs"]) / n  # noqa: E731
        by_seed = f"seed, n = {n}" if n > 1 else "seed (one run)"
        cells = [f"**{escape(g['variant'])}**", MISSING, f"{mean(estimate):.2f}", f"{mean(bound):.2f}"]
        lines.append("| " + " | ".join([*cells, interval_cell(g["by_seed"], "seed"), by_seed]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seqvae.analysis.estimator_gap",
        description="Two estimates of one quantity on the same checkpoints: their gap by text and by seed.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_GLOB")
    parser.add_argument("--estimate", required=True, help="the per-text column of the estimate examined (nll_bar)")
    parser.add_argument("--bound", default="iw_nll", help="the per-text column it is set against (default iw_nll)")
    parser.add_argument("--file", default="per_text.csv", help="each run's per-text file (default per_text.csv)")
    args = parser.parse_args(argv)
    try:
        groups = gaps(args.runs, args.estimate, args.bound, args.file)
    except (CompareError, OSError) as err:
        print(f"estimator_gap: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(groups, args.estimate, args.bound))
    return 0


if __name__ == "__main__":
    sys.exit(main())
