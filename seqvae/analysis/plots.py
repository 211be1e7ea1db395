"""`seqvae compare --plots DIR`: one PNG per validation curve (mean over a row's seeds, band from
their min to max) and one bar chart of the final test metrics (mean over seeds, 95% t-interval).
Legends sit beside the axes, never on the data; long row labels are wrapped.
"""

from __future__ import annotations

import csv
import math
import statistics
import textwrap
from pathlib import Path

from seqvae.analysis.differences import t975
from seqvae.metric_spec import SPEC, Metric
from seqvae.store.files import CURVES

LABEL_WIDTH = 38  # characters per line of a wrapped row label


def final_metrics() -> list[Metric]:
    """The bar chart's panels (metric_spec's `bar`), in order; a panel no row has is left out."""
    return [m for m in SPEC if m.bar]


def read_curves(path: Path) -> dict[str, dict[float, float]]:
    """column -> {epoch: value} from curves.csv (x: the `epoch` column + 1, else the row number)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[str, dict[float, float]] = {}
    for i, row in enumerate(rows):
        x = float(row["epoch"]) + 1 if row.get("epoch") else i + 1
        for k, v in row.items():
            if k.startswith("val/") and v not in ("", None):
                out.setdefault(k, {})[x] = float(v)
    return out


def y_scale(values: list[float]) -> tuple[str, dict]:
    """The y axis for a curve plot: "log" for positive values spanning more than 3 decades;
    "symlog" (linear within ± the median magnitude) when zeros or negatives come with values
    more than 1000× that median (the LM's KL of 0 beside a diverging epoch); else linear."""
    if not values:
        return "linear", {}
    if min(values) > 0:
        return ("log", {}) if max(values) / min(values) > 1e3 else ("linear", {})
    magnitudes = [abs(v) for v in values if v != 0]
    if not magnitudes:
        return "linear", {}
    typical = statistics.median(magnitudes)
    return ("symlog", {"linthresh": typical}) if max(magnitudes) / typical > 1e3 else ("linear", {})


def wrap(label: str) -> str:
    return "\n".join(textwrap.wrap(label, LABEL_WIDTH, break_on_hyphens=False)) or label


def mean_interval(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% t-interval); half-width 0 for one value (no interval)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def final_values(groups: list[dict], key: str) -> list[list[float]]:
    """Per group, the finite values of one metrics.json key over its runs."""
    out = []
    for g in groups:
        vals = [r["metrics"].get(key) for r in g["runs"]]
        out.append([float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)])
    return out


def curve_figure(metric: str, groups: list[dict], curves: list[list[dict]]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    for i, (g, runs) in enumerate(zip(groups, curves)):
        by_x: dict[float, list[float]] = {}
        for c in runs:
            for x, v in c.get(metric, {}).items():
                by_x.setdefault(x, []).append(v)
        if not by_x:
            continue
        xs = sorted(by_x)
        style = ("-", "--", ":")[(i // 10) % 3]  # the colour cycle has 10 colours: 11th line on, dashed
        mean = [statistics.fmean(by_x[x]) for x in xs]
        ax.plot(xs, mean, linestyle=style, marker="o", ms=3, label=wrap(f"{g['label']} (n={len(runs)})"))
        if len(runs) > 1:
            ax.fill_between(xs, [min(by_x[x]) for x in xs], [max(by_x[x]) for x in xs], alpha=0.2)
    ax.set(title=metric, xlabel="epoch", ylabel=metric)
    values = [v for runs in curves for c in runs for v in c.get(metric, {}).values()]
    scale, kwargs = y_scale(values)
    if scale != "linear":
        ax.set_yscale(scale, **kwargs)  # one diverging epoch would flatten every other line
    # Beside the axes: inside, a legend of many long labels covers the curves.
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    return fig


def bar_figure(groups: list[dict]):
    """Horizontal bars (one row per group, labels on the y axis), one panel per final metric;
    error bars are the 95% t-interval of the mean over the group's runs (none for one run)."""
    from matplotlib.figure import Figure

    panels = [(spec, final_values(groups, spec.key)) for spec in final_metrics()]
    panels = [p for p in panels if any(p[1])]
    if not panels:
        return None
    labels = [wrap(f"{g['label']} (n={len(g['runs'])})") for g in groups]
    height = max(3.0, 0.35 * sum(lab.count("\n") + 1 for lab in labels) + 1.5)
    fig = Figure(figsize=(3.2 * len(panels) + 3.5, height))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    ys = list(range(len(groups)))
    for ax, (spec, values) in zip(axes, panels):
        stats = [mean_interval(v) if v else (math.nan, 0.0) for v in values]
        ax.barh(ys, [m for m, _ in stats], xerr=[h for _, h in stats], capsize=3, color="C0", alpha=0.8)
        finite = [m for m, _ in stats if math.isfinite(m)]
        if spec.bar_zoom and finite:  # bars from 0 would hide differences of a few nats in ~400
            lo = min(m - h for m, h in stats if math.isfinite(m))
            hi = max(m + h for m, h in stats if math.isfinite(m))
            pad = max(0.1 * (hi - lo), 0.5)
            ax.set_xlim(lo - pad, hi + pad)
        ax.set_title(spec.header)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(ys, labels, fontsize="small")
    axes[0].invert_yaxis()  # first row on top, as in the table
    fig.suptitle("final test metrics: mean over seeds, 95% interval", fontsize="medium")
    fig.tight_layout()
    return fig


def plot(groups: list[dict], out_dir: Path) -> str:
    """Writes the PNGs; returns the line to print."""
    try:
        import matplotlib  # noqa: F401  (a dependency; a broken install should not lose the table)
    except ImportError:
        return "seqvae compare: plots skipped: matplotlib is not installed (pip install matplotlib)"
    curves = [[read_curves(r["path"] / CURVES) for r in g["runs"] if (r["path"] / CURVES).is_file()] for g in groups]
    metrics = sorted({m for runs in curves for c in runs for m in c})
    bars = bar_figure(groups)
    if not metrics and bars is None:
        return "seqvae compare: plots skipped: no run has a curves.csv with val/ columns or final test metrics"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in metrics:
        name = f"{metric.replace('/', '_')}.png"
        curve_figure(metric, groups, curves).savefig(out_dir / name, dpi=100, bbox_inches="tight")
        written.append(name)
    if bars is not None:
        bars.savefig(out_dir / "final_test.png", dpi=100, bbox_inches="tight")
        written.append("final_test.png")
    return f"seqvae compare: wrote {len(written)} plots to {out_dir} ({', '.join(written)})"
