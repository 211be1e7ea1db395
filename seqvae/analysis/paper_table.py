"""A published table, row by row, beside seqvae's runs of the same methods: the pooling paper's Table 1
(Long et al.) is `docs/results/table1.yaml`.

    python -m seqvae.analysis.paper_table docs/results/table1.yaml                 # markdown, one table per grid
    python -m seqvae.analysis.paper_table docs/results/table1.yaml --format json   # every cell's n, mean, s.d., interval

The declaration (YAML) holds the paper's rows in the paper's order, each with the numbers the paper
prints per dataset and the estimator its NLL is (`estimator:`, a key of `estimators:`), and the
seqvae variant directories that run that row (`runs:`; a row seqvae has two protocols for lists
both). Per dataset it names the grids to set beside the paper: their export roots and the sweep
files that make them. A grid is read as `seqvae compare '<root>/<variant>/seed*' ... --label dir
--baseline '<root>/lm/seed*'` reads it, over the table's variants only (the same groups,
differences, intervals and notes), the baseline being the row marked `baseline: true` (the LM).

The paper's absolute NLLs are on the full Yahoo/Yelp splits; seqvae's grids are 10k-text subsets
with their own vocabulary and test texts, so only differences within one column are comparable:
the paper's `NLL − LM` beside seqvae's `IW-NLL − LM [95% interval]`. A row the paper gives with
another estimator (the LM's exact NLL aside) gets no paper difference: its NLL is not the others'.
A row a grid's sweep declares but whose runs are not exported says `not run` and the sweep; a row
no grid declares says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
from pathlib import Path

import yaml

from seqvae.analysis.compare import escape, group_runs, table_notes
from seqvae.analysis.runs import MISSING, CompareError, find_runs
from seqvae.analysis.table_cells import add_differences, cell_of, ks, stat_cell
from seqvae.metric_spec import metric

PAPER_METRICS = ("kl", "mi", "au")  # the paper's columns after NLL; seqvae's metric ids of the same quantities
NLL_KEYS = ("nll", "nll_bar")  # the paper's NLL column, or Fang et al.'s NLL-bar in the iVAE row


class TableError(Exception):
    pass


def read_declaration(path: Path) -> dict:
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise TableError(f"{path}: {err}".splitlines()[0]) from None
    for key in ("source", "estimators", "datasets", "rows"):
        if not isinstance(spec, dict) or key not in spec:
            raise TableError(f"{path}: no `{key}:` (a declaration has source, estimators, datasets and rows)")
    for i, row in enumerate(spec["rows"], 1):
        if not row.get("row") or not isinstance(row.get("runs"), list):
            raise TableError(f"{path}: rows[{i}] needs `row:` (its name) and `runs:` (a list of variant directories)")
        estimator = row.get("estimator")
        if estimator is not None and estimator not in spec["estimators"]:
            raise TableError(f"{path}: rows[{i}] ({row['row']}): estimator {estimator!r} is not in `estimators:`")
        for name in row:
            if name not in ("row", "runs", "estimator", "note", "baseline") and name not in spec["datasets"]:
                raise TableError(f"{path}: rows[{i}] ({row['row']}): {name!r} is neither a dataset nor a row key")
            if name in spec["datasets"]:
                check_numbers(row[name], f"{path}: rows[{i}] ({row['row']}).{name}")
    for about in spec["datasets"].values():
        for grid in about.get("grids", []):
            # a root not exported yet is a grid's row `not run`; no root at all is a path read from elsewhere
            if not any(Path(root).is_dir() for root in grid.get("roots", [])):
                raise TableError(
                    f"{path}: grid {grid.get('name')!r}: none of its roots is a directory ({', '.join(grid.get('roots', []))}); "
                    f"paths are relative to the current directory ({Path.cwd()})"
                )
    if not any(row.get("baseline") for row in spec["rows"]):
        raise TableError(f"{path}: no row is `baseline: true` (the row the paper's and seqvae's differences are to)")
    return spec


def check_numbers(numbers, where: str) -> None:
    """A row's numbers for one dataset: only the paper's columns (a misspelt key, `kll: 8.0`, was
    rendered as a blank `–` cell), each a number as printed (a string gave a traceback), or a note."""
    if not isinstance(numbers, dict):
        raise TableError(f"{where}: expected the paper's numbers as a mapping ({', '.join((*NLL_KEYS, *PAPER_METRICS))}, note)")
    for key, value in numbers.items():
        if key == "note":
            continue
        if key not in (*NLL_KEYS, *PAPER_METRICS):
            raise TableError(f"{where}: {key!r} is not a column of the table ({', '.join((*NLL_KEYS, *PAPER_METRICS))}, note)")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TableError(f"{where}.{key}: expected a number as the paper prints it; got {value!r}")


def declared_variants(sweeps: list[str]) -> dict[str, str]:
    """variant name → the sweep file that declares it."""
    out: dict[str, str] = {}
    for sweep in sweeps:
        try:
            variants = (yaml.safe_load(Path(sweep).read_text(encoding="utf-8")) or {}).get("variants") or []
        except (OSError, yaml.YAMLError) as err:
            raise TableError(f"{sweep}: {err}".splitlines()[0]) from None
        for v in variants:
            out.setdefault(v["name"], sweep)
    return out


def variant_runs(grid: dict, variant: str) -> list[str]:
    """The run-directory globs of one variant in the grid's roots that match something."""
    return [p for root in grid["roots"] if glob.glob(p := f"{root}/{variant}/seed*")]


def read_grid(spec: dict, grid: dict) -> tuple[dict[str, dict], list[str]]:
    """compare's groups of the table's variants in a grid (baseline first, differences filled) as
    variant → group, and the lines under the table; empty where the baseline has no runs."""
    lm = next(r for r in spec["rows"] if r.get("baseline"))["runs"][0]
    baseline_globs = variant_runs(grid, lm)
    if not baseline_globs:
        return {}, []
    others = [p for row in spec["rows"] for v in row["runs"] if v != lm for p in variant_runs(grid, v)]
    baseline = find_runs(baseline_globs, option="baseline")
    groups = group_runs(find_runs(others) if others else [], "dir", baseline, repr(baseline_globs[0]))
    pairings = add_differences(groups)
    by_variant = {r["path"].parent.name: g for g in groups for r in g["runs"]}
    return by_variant, [*pairings, *table_notes(groups, "dir")]


def paper_cells(row: dict, dataset: str, spec: dict, lm: float | None) -> dict:
    """The paper's NLL (marked with its estimator unless it is the table's usual one), NLL − LM where comparable, KL, MI, AU."""
    numbers = row.get(dataset) or {}
    nll_key = next((k for k in NLL_KEYS if numbers.get(k) is not None), None)
    estimator = row.get("estimator") or spec["default_estimator"]
    if nll_key is None:
        nll = diff = MISSING
    else:
        mark = "" if estimator == spec["default_estimator"] else f" ({spec['estimators'][estimator]['short']})"
        nll = f"{numbers[nll_key]:.1f}{mark}"
        comparable = estimator == spec["default_estimator"] and lm is not None and not row.get("baseline")
        diff = f"{numbers[nll_key] - lm:+.1f}" if comparable else MISSING
    out = {"nll": nll, "diff": diff}
    for mid in PAPER_METRICS:
        v = numbers.get(mid)
        out[mid] = MISSING if v is None else (f"{v:.0f}" if mid == "au" and float(v).is_integer() else f"{v:.1f}")
    return out


def seqvae_cells(variant: str, by_variant: dict) -> dict | None:
    g = by_variant.get(variant)
    if g is None:
        return None
    base = next(b for b in by_variant.values() if b["baseline"])
    cells = {"n": str(len(g["runs"])), "iw_nll": stat_cell(g["stats"]["iw_nll"], metric("iw_nll").digits)}
    cells["diff"] = "baseline" if g["baseline"] else cell_of(g, base, "iw_nll", metric("iw_nll").digits)
    for mid in PAPER_METRICS:
        cells[mid] = stat_cell(g["stats"][mid], metric(mid).digits)
    return cells


def absent(variant: str, declared: dict[str, str]) -> str:
    return f"not run (`{declared[variant]}`)" if variant in declared else "not in this grid"


def grid_table(spec: dict, dataset: str, grid: dict) -> tuple[list[str], list[dict]]:
    """One grid's markdown table beside the paper, and its rows as data."""
    by_variant, notes = read_grid(spec, grid)
    declared = declared_variants(grid.get("sweeps", []))
    lm_row = next(r for r in spec["rows"] if r.get("baseline"))
    lm = (lm_row.get(dataset) or {}).get("nll")
    k = ks([r for g in by_variant.values() for r in g["runs"]]) or MISSING
    lines = [
        f"**{spec['datasets'][dataset]['title']}: the paper beside `{grid['name']}`** — {grid['about']}; "
        f"K = {k} at test. seqvae's n: runs (seeds); IW-NLL, KL, MI, AU: mean ± s.d. over them; "
        f"IW-NLL − LM: mean [95% interval] as `seqvae compare --baseline` gives it (* excludes 0).",
        "",
        "| Table 1 row | paper NLL | paper NLL − LM | paper KL | paper MI | paper AU "
        "| seqvae run | n | IW-NLL | IW-NLL − LM | KL | MI | AU |",
        "|---" * 13 + "|",
    ]
    data = []
    for row in spec["rows"]:
        paper = paper_cells(row, dataset, spec, lm)
        numbers = row.get(dataset) or {}
        for i, variant in enumerate(row["runs"]):
            ours = seqvae_cells(variant, by_variant)
            record = {"row": row["row"], "variant": variant, "paper": numbers, "estimator": row.get("estimator")}
            if ours is None:
                ours_cells = [variant, MISSING, absent(variant, declared), *[MISSING] * 4]
            else:
                g = by_variant[variant]
                record.update(n=len(g["runs"]), stats={m: g["stats"][m] for m in ("iw_nll", *PAPER_METRICS)})
                record["difference"] = None if g["baseline"] else g["difference"].get("iw_nll")
                ours_cells = [variant, ours["n"], ours["iw_nll"], ours["diff"], *(ours[m] for m in PAPER_METRICS)]
            data.append(record)
            notes_ = [n for n in (row.get("note"), numbers.get("note")) if n]
            name = row["row"] + (f" ({'; '.join(notes_)})" if notes_ else "")
            # a row seqvae runs two ways (iVAE: the reference's protocol and seqvae's) prints the paper's numbers once
            left = [escape(name), paper["nll"], paper["diff"], *(paper[m] for m in PAPER_METRICS)] if i == 0 else ["↳", *[""] * 5]
            lines.append("| " + " | ".join([*left, *ours_cells]) + " |")
    footer = [f"- {line}" for line in notes]
    return lines + ([""] + footer if footer else []), data


def render(spec: dict, fmt: str) -> str:
    if fmt == "json":
        doc = {"source": spec["source"], "estimators": spec["estimators"], "tables": []}
        for dataset, about in spec["datasets"].items():
            for grid in about["grids"]:
                doc["tables"].append({"dataset": dataset, "grid": grid["name"], "rows": grid_table(spec, dataset, grid)[1]})
        return json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n"
    marks = "; ".join(f"*{e['short']}*: {e['what']}" for e in spec["estimators"].values())
    columns = ", ".join(f"`{metric(m).key}`" for m in PAPER_METRICS)
    out = [
        f"The paper's numbers: {spec['source']}. Its NLL column: {marks}. "
        f"seqvae's KL, MI and AU columns are its {columns} (their estimators: docs/metrics.md).",
        "",
    ]
    for dataset, about in spec["datasets"].items():
        for grid in about["grids"]:
            out += [*grid_table(spec, dataset, grid)[0], ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m seqvae.analysis.paper_table",
        description="A published table's rows beside seqvae's runs of the same methods, from a declaration.",
    )
    parser.add_argument("declaration", type=Path, help="the table's YAML (e.g. docs/results/table1.yaml)")
    parser.add_argument("--format", choices=["markdown", "json"], default="markdown")
    args = parser.parse_args(argv)
    try:
        spec = read_declaration(args.declaration)
        spec["default_estimator"] = next(iter(spec["estimators"]))
        text = render(spec, args.format)
    except (TableError, CompareError) as err:
        print(f"paper_table: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
