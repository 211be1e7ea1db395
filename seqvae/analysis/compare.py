"""`seqvae compare`: one table row per method over seeds, from finished run directories, and
each row's difference to a baseline with a 95% interval.

    seqvae compare 'runs/yahoo10k/*/seed*' [--label dir] [--format markdown|csv|json] [--plots DIR]
    seqvae compare 'docs/results/yahoo10k_short/*/seed*' --label dir --baseline 'docs/results/yahoo10k_short/lm/seed*'

Each run directory (a training run, or its export under docs/results/<dataset>/<variant>/seed<N>/)
holds config.yaml and metrics.json. Runs whose configs differ only by seed form one group; a row
is labelled by the config keys that vary across groups (`pooling=max`), or, with `--label dir`,
by the name of the directory above its seed directories (`<root>/<variant>/seed<N>`: `max`).

With `--baseline PATTERN` the runs matching PATTERN (one configuration) are the baseline row, and
every other row gets, per metric, the difference row − baseline and its 95% interval:
- both sides several runs, ≥ 2 seeds (`seed_everything`) in common: paired by seed,
  mean(D_s) ± t(0.975, S−1)·sd(D)/√S over the common seeds;
- both sides several runs, fewer common seeds: unpaired Welch interval (df rounded down);
- otherwise one run against one run (the baseline run of the row's seed when the baseline has
  several): IW-NLL, −ELBO and KL paired by test text from the runs' per-text files when both were
  tested on the same texts (`test_texts_sha256`), mean(d_i) ± t(0.975, N−1)·sd(d)/√N; the set-level
  metrics (MI, AU, ...) and runs without per-text files get the difference and no interval.
The interval covers what was paired: by text, the test sample and the importance-sampling noise of
these two checkpoints; by seed, also the training randomness the seeds varied.
Runs are compared only on the texts they were tested on (`test_texts_sha256` in metrics.json; runs
from before it was recorded count as tested on the same texts): a row whose runs were tested on
different texts is named under the table, and a difference whose two sides (the runs it uses) were
not all tested on the same texts is the difference of the means with no interval, named not comparable.
A run whose metrics.json holds a broken check record (`seqvae/core/eval_checks.py`: BN-VAE's bound `bn_bound`,
WAE-RNF's BatchNorm heads `rnf_bn_heads`) has its posterior metrics (KL, AU, MI, IW-NLL, PPL, ...) marked † in its
row and in differences it enters, with the check's footnote.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

from seqvae.analysis.differences import DIFF_KEYS, diff_ids, t975  # noqa: F401  (t975: API)
from seqvae.analysis.labels import (  # noqa: F401  (re-exported: compare's API)
    COMMON_LABEL,
    common_settings_note,
    common_values,
    config_label,
    config_labels,
    dir_label,
    label_config,
    short_names,
    show,
    unique_dir_labels,
    varying_keys,
)
from seqvae.analysis.plots import plot, read_curves, y_scale  # noqa: F401  (re-exported: compare's API)
from seqvae.analysis.run_notes import THREADS_MARK, mixed_threads, provenance_note, retest_note, thread_counts, thread_notes
from seqvae.analysis.runs import (  # noqa: F401  (re-exported: compare's API)
    CHECK_MARK,
    MISSING,
    CompareError,
    check_broken,
    check_notes,
    commit_warning,
    find_runs,
    flatten,
    load_run,
    marks_every_metric,
    repeated_seed_notes,
    summarize,
    test_texts,
    test_texts_notes,
    texts_digests,
)
from seqvae.analysis.table_cells import (  # noqa: F401  (re-exported: compare's API)
    BY_TEXT_NOTE,
    DEGENERATE_NOTE,
    SEEDS_NOTE,
    add_differences,
    cell_of,
    diff_cell,
    seeds_needed,
    stat_cell,
)
from seqvae.metric_spec import compared, differenced, ids, metric
from seqvae.rundir.curves import write_curves  # noqa: F401  (re-exported: compare's API)

# compare's metric lists as named before metric_spec, for code that read them here; built from the
# spec when asked, so they always agree with it.
LEGACY_LISTS = {
    "METRICS": lambda: [(m.id, m.header, m.key, m.digits) for m in compared()],  # (id, header, key, digits)
    "KEY": lambda: {m.id: m.key for m in compared()},
    "HEADER": lambda: {m.id: m.header for m in compared()},
    "DIGITS": lambda: {m.id: m.digits for m in compared()},
    "DIFF_METRICS": lambda: tuple(diff_ids()),
    "MC_SE": lambda: {m.id: m.mc_se for m in differenced() if m.mc_se},
    "BN_UNRELIABLE": lambda: ids("bn_sensitive"),
}


def __getattr__(name: str):
    if name in LEGACY_LISTS:
        return LEGACY_LISTS[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def by_config(runs: list[dict]) -> list[dict]:
    groups: dict[str, dict] = {}
    for run in runs:
        key = json.dumps(run["config"], sort_keys=True, default=str)
        groups.setdefault(key, {"config": run["config"], "runs": [], "baseline": False})["runs"].append(run)
    return list(groups.values())


def group_runs(
    runs: list[dict], label_by: str = "config", baseline: list[dict] | None = None, baseline_name: str = ""
) -> list[dict]:
    """One group per config (seeds pooled), labelled, with per-metric mean and s.d. With `baseline`
    (runs, taken out of `runs`), they form the first group, flagged "baseline"; they must be one config."""
    out = []
    if baseline:
        base_paths = {r["path"].resolve() for r in baseline}
        runs = [r for r in runs if r["path"].resolve() not in base_paths]
        base_groups = by_config(baseline)
        if len(base_groups) > 1:
            differ = ", ".join(varying_keys(base_groups)[:5])
            option = " ".join(["--baseline", baseline_name]).strip()
            raise CompareError(
                f"{option}: its {len(baseline)} runs are {len(base_groups)} configurations, not one (they differ in {differ})"
            )
        base_groups[0]["baseline"] = True
        out.append(base_groups[0])
    out += by_config(runs)
    by_dir = label_by == "dir" or not varying_keys(out)
    if by_dir:
        for g in out:
            g["label"] = dir_label(g, 1)
    else:
        config_labels(out)
    for g in out:
        g["stats"] = {m.id: summarize(g["runs"], m) for m in compared()}
    if label_by == "dir":
        unique_dir_labels(out)
    return out


# ---------------------------------------------------------------- differences to the baseline


# ---------------------------------------------------------------- notes and warnings


def filled_in_notes(groups: list[dict]) -> list[str]:
    """One line per set of defaults filled into older configs, naming the rows (and runs) that lacked them."""
    by_keys: dict[str, list[str]] = {}
    for g in groups:
        per_key: dict[str, list[dict]] = {}
        for r in g["runs"]:
            if r["filled"]:
                per_key.setdefault(", ".join(f"{k}={show(k, v)}" for k, v in r["filled"].items()), []).append(r)
        for keys, runs in per_key.items():
            if len(runs) == len(g["runs"]):
                which = f"{g['label']} (all {len(runs)})" if len(runs) > 1 else g["label"]
            else:
                which = f"{g['label']} ({', '.join(r['path'].name for r in runs)})"
            by_keys.setdefault(keys, []).append(which)
    return [
        f"Filled in {keys} (config.yaml written before the key existed; the default then): {'; '.join(rows)}"
        for keys, rows in by_keys.items()
    ]


def table_notes(groups: list[dict], label_by: str) -> list[str]:
    """The lines under a table of these groups: texts, settings, filled-in defaults, broken checks, seeds,
    threads, provenance."""
    return [
        *test_texts_notes(groups),
        *common_settings_note(groups, label_by),
        *filled_in_notes(groups),
        *check_notes(groups),
        *repeated_seed_notes(groups),
        *thread_notes(groups),
        *retest_note(groups),
        *provenance_note(groups),
    ]


# ---------------------------------------------------------------- output


def run_json(r: dict) -> dict:
    out = {
        "path": str(r["path"]),
        "seed": r["seed"],
        "provenance": r["metrics"].get("provenance"),
        "seeds": r["metrics"].get("seeds"),
        "filled_in": r["filled"],
        "retest": r["retest"],
    }
    for key, record in r["metrics"].items():  # the runs' check records (`eval_checks.py`: bn_bound, rnf_bn_heads)
        if isinstance(record, dict) and "broken" in record:
            out[key] = record
    return out


def unreliable(*groups: dict) -> tuple[str, ...]:
    """The metric ids marked † in these groups' cells: the bn_sensitive ones when a check of any of their runs broke,
    every one when such a record qualifies them all (a partial test)."""
    runs = [r for g in groups for r in g["runs"]]
    if any(marks_every_metric(r) for r in runs):
        return tuple(m.id for m in compared())
    return ids("bn_sensitive") if any(check_broken(r) for r in runs) else ()


def render_json(groups: list[dict], pairings: list[str], warnings: list[str], resolve: float | None = None) -> str:
    rows = []
    for g in groups:
        row = {
            "label": g["label"],
            "n": len(g["runs"]),
            "baseline": g["baseline"],
            "runs": [run_json(r) for r in g["runs"]],
            "torch_threads": thread_counts(g["runs"]),
        }
        row.update(g["stats"])
        if unreliable(g):
            row["unreliable"] = list(unreliable(g))
        if "difference" in g:
            row["paired_by"] = g["paired_by"]
            row["pairing"] = g["pairing"]
            row["difference"] = g["difference"]
            base = next(b for b in groups if b["baseline"])
            row["difference_mixes_threads"] = mixed_threads(g, base)
            for mid in set(unreliable(g, base)) & set(g["difference"]):
                row["difference"][mid] = {**row["difference"][mid], "unreliable": True}
        rows.append(row)
    base = next((g["label"] for g in groups if g["baseline"]), None)
    doc = {"rows": rows, "baseline": base, "resolve": resolve, "pairings": pairings, "warnings": warnings}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(groups: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    with_diff = any(g["baseline"] for g in groups)
    mids, diff_mids = [m.id for m in compared()], diff_ids()
    header = ["label", "n", *(f"{mid}_{s}" for mid in mids for s in ("mean", "std"))]
    if with_diff:
        header += ["baseline", "paired_by", *(f"{mid}_diff_{s}" for mid in diff_mids for s in ("mean", "lo", "hi", "n"))]
    writer.writerow(header)
    for g in groups:
        stats = [g["stats"][mid][s] for mid in mids for s in ("mean", "std")]
        row = [g["label"], len(g["runs"]), *("" if v is None else repr(v) for v in stats)]
        if with_diff:
            diff = g.get("difference", {})
            cells = [diff.get(mid, {}).get(s) for mid in diff_mids for s in ("diff", "lo", "hi", "n")]
            row += [int(g["baseline"]), g.get("paired_by", ""), *("" if v is None else repr(v) for v in cells)]
        writer.writerow(row)
    return buf.getvalue()


def cell(stat: dict, digits: int, mark: bool = False) -> str:
    return stat_cell(stat, digits, CHECK_MARK * mark)


def escape(label: str) -> str:
    return label.replace("|", "\\|")


def render_table(groups: list[dict]) -> list[str]:
    # Markdown is for reading: a metric column no run has (e.g. one added after the runs) is left out.
    shown = [(m.id, m.header) for m in compared() if any(g["stats"][m.id]["mean"] is not None for g in groups)]
    headers = [h for mid, h in shown if mid not in ("encoder_updates", "decoder_updates", "train_minutes")]
    headers += ["enc / dec updates", "train minutes"]
    lines = ["| run | n | " + " | ".join(headers) + " |", "|---" * (len(headers) + 2) + "|"]
    for g in groups:
        cells = {m.id: cell(g["stats"][m.id], m.digits, m.id in unreliable(g)) for m in compared()}
        updates = f"{cells.pop('encoder_updates')} / {cells.pop('decoder_updates')}"
        minutes = cells.pop("train_minutes")
        values = [cells[mid] for mid, _ in shown if mid in cells]
        n = f"{len(g['runs'])}{THREADS_MARK * mixed_threads(g)}"
        lines.append(f"| {escape(g['label'])} | {n} | " + " | ".join([*values, updates, minutes]) + " |")
    return lines


def render_differences(groups: list[dict]) -> list[str]:
    base = next(g for g in groups if g["baseline"])
    has = lambda mid: any(g["stats"][mid]["mean"] is not None for g in groups)  # noqa: E731
    shown = [m.id for m in differenced() if m.every_run or has(m.id)]  # the probe: only where runs were probed
    se_cols = [m.mc_se for m in differenced() if m.mc_se and has(m.mc_se)]
    headers = [metric(mid).header for mid in [*shown, *se_cols]]
    lines = [
        f"Differences to the baseline {escape(base['label'])}: row − baseline, mean [95% interval]; "
        "* the interval excludes 0; n/a: no interval (the line under the table says why). "
        "The baseline row shows its own mean ± s.d."
        + (" MC se: each row's own Monte-Carlo standard error (the root mean square of its runs')." if se_cols else ""),
        "",
        "| run | n | paired by | " + " | ".join(headers) + " |",
        "|---" * (len(headers) + 3) + "|",
    ]
    for g in groups:
        marked = unreliable(g, base)  # a difference is marked when either side's runs broke the bound
        if g["baseline"]:
            cells = [cell(g["stats"][mid], metric(mid).digits, mid in marked) for mid in shown]
            label, paired = f"{escape(g['label'])} (baseline)", MISSING
        else:
            cells = [cell_of(g, base, mid, metric(mid).digits) for mid in shown]
            cells = [c + CHECK_MARK * (mid in marked and c != MISSING) for mid, c in zip(shown, cells)]
            label, paired = escape(g["label"]), g["paired_by"]
        cells += [cell(g["stats"][mid], metric(mid).digits) for mid in se_cols]
        n = f"{len(g['runs'])}{THREADS_MARK * mixed_threads(g, base)}"
        lines.append(f"| {label} | {n} | {paired} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(groups: list[dict], pairings: list[str], notes: list[str]) -> str:
    lines = render_differences(groups) if any(g["baseline"] for g in groups) else render_table(groups)
    # A blank line ends the table (a text line right under it would be read as one more row).
    footer = [f"- {line}" for line in [*pairings, *notes]]
    if footer:
        lines += ["", *footer]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="seqvae compare",
        description="Table of finished runs, one row per config over seeds; with --baseline, each row's difference to "
        "the baseline with a 95% interval.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_GLOB", help="run directories, or globs (quoted) matching them")
    parser.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    parser.add_argument(
        "--label", choices=["config", "dir"], default="config", help="row labels: varying config keys, or variant directory"
    )
    parser.add_argument(
        "--baseline",
        metavar="RUN_DIR_OR_GLOB",
        help="runs of one config (quoted glob or directory): every other row's difference to them, with 95%% intervals",
    )
    parser.add_argument(
        "--allow-mixed-k",
        action="store_true",
        help="difference IW-NLL and PPL of runs tested with different K importance samples or on other texts",
    )
    parser.add_argument(
        "--resolve",
        type=float,
        metavar="X",
        help="also say how many seeds a by-seed interval would need to exclude 0 for a difference of X",
    )
    parser.add_argument(
        "--plots", type=Path, metavar="DIR", help="write one PNG per validation curve and a bar chart of the final test metrics"
    )
    args = parser.parse_args(argv)
    if args.resolve is not None and (args.baseline is None or not math.isfinite(args.resolve) or args.resolve == 0):
        # it was ignored without a baseline (no differences to resolve), and `inf` answered "none"
        parser.error(
            "--resolve X: needs --baseline and a finite, non-zero X" if args.baseline else "--resolve X: needs --baseline"
        )
    blocking = next((p for p in (args.plots, *args.plots.parents) if p.exists() and not p.is_dir()), None) if args.plots else None
    if blocking is not None:  # before: a FileExistsError traceback after the table was printed
        print(f"seqvae compare: error: --plots {args.plots}: {blocking} is a file, not a directory", file=sys.stderr)
        return 2
    try:
        runs = find_runs(args.runs)
        baseline = find_runs([args.baseline], option="--baseline") if args.baseline is not None else None
        groups = group_runs(runs, args.label, baseline, repr(args.baseline))
        pairings = add_differences(groups, args.allow_mixed_k, args.resolve)
    except (CompareError, OSError) as err:
        print(f"seqvae compare: error: {err}", file=sys.stderr)
        return 2
    notes = table_notes(groups, args.label)
    commits = commit_warning([r for g in groups for r in g["runs"]])
    if commits:
        print(f"seqvae compare: warning: {commits}", file=sys.stderr)
    if args.format == "json":
        sys.stdout.write(render_json(groups, pairings, [*([commits] if commits else []), *notes], args.resolve))
    elif args.format == "csv":
        sys.stdout.write(render_csv(groups))
        for line in [*pairings, *notes]:  # the CSV stays one table; what would be footnotes goes to stderr
            print(f"seqvae compare: {line}", file=sys.stderr)
    else:
        sys.stdout.write(render_markdown(groups, pairings, notes))
    if args.plots is not None:
        print(plot(groups, args.plots), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
