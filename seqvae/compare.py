"""`seqvae compare`: one table row per method over seeds, from finished run directories.

    seqvae compare 'runs/yahoo10k/*/seed*' [--format markdown|csv|json] [--plots DIR]

Each run directory (a training run, or its export under docs/results/<dataset>/<variant>/seed<N>/)
holds config.yaml and metrics.json. Runs whose configs differ only by seed form one group; a row
is labelled by the config keys that vary across groups (`pooling=max`), or, with `--label dir`,
by the name of the directory above its seed directories (`<root>/<variant>/seed<N>`: `max`).
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import os
import statistics
import sys
from pathlib import Path

import yaml

# (id used in CSV/JSON, markdown header, metrics.json key, digits)
METRICS = [
    ("iw_nll", "IW-NLL", "test/iw_nll", 2),
    ("neg_elbo", "−ELBO", "test/loss", 2),
    ("kl", "KL", "test/kl", 2),
    ("mi", "MI", "test/mi", 2),
    ("mi_dataset", "MI(dataset)", "test/mi_dataset", 2),
    ("au", "AU", "test/au", 1),
    ("feature_cos", "feature cos", "test/feature_cos", 4),
    ("feature_ev1", "feature EV1", "test/feature_ev1", 3),
    ("feature_ev3", "feature EV3", "test/feature_ev3", 3),
    ("feature_erank", "feature erank", "test/feature_erank", 1),
    ("mu_erank", "μ erank", "test/mu_erank", 1),
    ("iw_ppl", "PPL", "test/iw_ppl", 1),
    ("encoder_updates", "enc updates", "encoder_updates", 0),
    ("decoder_updates", "dec updates", "decoder_updates", 0),
    ("train_minutes", "train minutes", "fit_seconds", 1),
]
# model.init_encoder_from names the stage-1 run of the same seed (freebits after autoencoder).
# The others change how a run is saved, launched or used after training, never its numbers;
# runs written before they existed must still group with runs written after.
IGNORED = (
    "seed_everything", "data.seed", "trainer.logger", "checkpoint", "ckpt_path", "trainer.default_root_dir",
    "model.init_encoder_from", "periodic_checkpoint", "model.generation", "trainer.use_distributed_sampler",
)  # fmt: skip
KEPT = ("checkpoint.monitor",)
# Settings added after runs were recorded, with the value every run from before them used: a run
# written without the key groups with runs that set it to that value, and with no others.
DEFAULTS_OF_NEWER_KEYS = {"model.init": "reference", "model.bn_eps": 1e-5}
MISSING = "–"


class CompareError(Exception):
    pass


def flatten(obj, prefix: str = "") -> dict:
    """Nested dicts and lists -> {"model.kl_schedule.init_args.start": 0.1, ...}."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else None
    if items is None or not obj:
        return {prefix: obj}
    out = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def ignored(key: str) -> bool:
    return key not in KEPT and any(key == p or key.startswith(p + ".") for p in IGNORED)


def load_run(path: Path) -> dict:
    missing = [n for n in ("config.yaml", "metrics.json") if not (path / n).is_file()]
    if missing:
        raise CompareError(f"{path}: not a run directory (no {' or '.join(missing)})")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        metrics = json.loads((path / "metrics.json").read_text())
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: {' '.join(str(err).split())}") from err
    flat = {k: v for k, v in flatten(config).items() if not ignored(k)}
    if "model" in config:
        flat = {**DEFAULTS_OF_NEWER_KEYS, **flat}
    return {"path": path, "config": flat, "metrics": metrics}


def find_runs(patterns: list[str]) -> list[dict]:
    paths: list[Path] = []
    for pattern in patterns:
        matches = [pattern] if os.path.isdir(pattern) else sorted(p for p in glob.glob(pattern) if os.path.isdir(p))
        if not matches:
            raise CompareError(f"no run directories match {pattern!r}")
        paths += [Path(m) for m in matches if Path(m).resolve() not in {p.resolve() for p in paths}]
    return [load_run(p) for p in paths]


def show(key: str, value) -> str:
    if key.endswith("class_path") and isinstance(value, str):
        return value.rsplit(".", 1)[-1]
    return json.dumps(value) if value is None or isinstance(value, (bool, list, dict)) else str(value)


def short_names(keys: list[str]) -> dict[str, str]:
    """Shortest dotted suffix (without class_path/init_args) that tells the varying keys apart."""
    parts = {k: [p for p in k.split(".") if p not in ("class_path", "init_args")] or [k] for k in keys}
    depth = {k: 2 if parts[k][-1].isdigit() else 1 for k in keys}
    while True:
        names = {k: ".".join(parts[k][-depth[k] :]) for k in keys}
        clash = [k for k in keys if list(names.values()).count(names[k]) > 1 and depth[k] < len(parts[k])]
        if not clash:
            return names
        for k in clash:
            depth[k] += 1


def group_runs(runs: list[dict], label_by: str = "config") -> list[dict]:
    groups: dict[str, dict] = {}
    for run in runs:
        key = json.dumps(run["config"], sort_keys=True, default=str)
        groups.setdefault(key, {"config": run["config"], "runs": []})["runs"].append(run)
    out = list(groups.values())
    keys = sorted({k for g in out for k in g["config"]})
    varying = [k for k in keys if len({json.dumps(g["config"].get(k, "<absent>"), default=str) for g in out}) > 1]
    names = short_names(varying)
    for g in out:
        label = ", ".join(f"{names[k]}={show(k, g['config'][k])}" for k in varying if k in g["config"])
        parents = dict.fromkeys(r["path"].resolve().parent.name for r in g["runs"])
        g["label"] = ",".join(parents) if label_by == "dir" or not label else label
        g["stats"] = {mid: summarize(g["runs"], key) for mid, _, key, _ in METRICS}
    return out


def summarize(runs: list[dict], key: str) -> dict:
    values = [float(r["metrics"][key]) for r in runs if isinstance(r["metrics"].get(key), (int, float))]
    if key == "fit_seconds":
        values = [v / 60 for v in values]
    return {
        "mean": statistics.fmean(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else None,
    }


def cell(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return MISSING
    text = f"{stat['mean']:.{digits}f}"
    return text if stat["std"] is None else f"{text} ± {stat['std']:.{digits}f}"


def render(groups: list[dict], fmt: str) -> str:
    if fmt == "json":
        rows = [
            {"label": g["label"], "n": len(g["runs"]), "runs": [str(r["path"]) for r in g["runs"]], **g["stats"]} for g in groups
        ]
        return json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["label", "n", *(f"{mid}_{s}" for mid, *_ in METRICS for s in ("mean", "std"))])
        for g in groups:
            stats = [g["stats"][mid][s] for mid, *_ in METRICS for s in ("mean", "std")]
            writer.writerow([g["label"], len(g["runs"]), *("" if v is None else repr(v) for v in stats)])
        return buf.getvalue()
    # Markdown is for reading: a metric column no run has (e.g. one added after the runs) is left out.
    shown = [(mid, h, d) for mid, h, _, d in METRICS if any(g["stats"][mid]["mean"] is not None for g in groups)]
    headers = [h for mid, h, _ in shown if mid not in ("encoder_updates", "decoder_updates", "train_minutes")]
    headers += ["enc / dec updates", "train minutes"]
    lines = ["| run | n | " + " | ".join(headers) + " |", "|---" * (len(headers) + 2) + "|"]
    for g in groups:
        cells = {mid: cell(g["stats"][mid], digits) for mid, _, _, digits in METRICS}
        updates = f"{cells.pop('encoder_updates')} / {cells.pop('decoder_updates')}"
        minutes = cells.pop("train_minutes")
        label = g["label"].replace("|", "\\|")
        values = [cells[mid] for mid, _, _ in shown if mid in cells]
        lines.append(f"| {label} | {len(g['runs'])} | " + " | ".join([*values, updates, minutes]) + " |")
    return "\n".join(lines) + "\n"


def write_curves(run_dir: Path, out: Path) -> int:
    """Writes curves.csv (step, train/lr, epoch and every val/ scalar, one row per validation)
    from the run's TensorBoard event files (a resumed run has several); returns the row count."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, dict[int, float]] = {}
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    val_tags = sorted(t for t in scalars if t.startswith("val/"))
    extra = [t for t in ("train/lr", "train/wall_seconds", "epoch") if t in scalars]
    steps = sorted(scalars.get("val/loss", {}))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")
    with open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *extra, *val_tags])
        for step in steps:
            writer.writerow([step, *(scalars[t].get(step, "") for t in extra + val_tags)])
    os.replace(tmp, out)
    return len(steps)


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


def plot(groups: list[dict], out_dir: Path) -> str:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return "seqvae compare: plots skipped: matplotlib is not installed (pip install 'seqvae[plots]')"
    curves = [[read_curves(r["path"] / "curves.csv") for r in g["runs"] if (r["path"] / "curves.csv").is_file()] for g in groups]
    metrics = sorted({m for runs in curves for c in runs for m in c})
    if not metrics:
        return "seqvae compare: plots skipped: no run has a curves.csv with val/ columns"
    out_dir.mkdir(parents=True, exist_ok=True)
    for metric in metrics:
        fig = Figure(figsize=(6, 4))
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
            ax.plot(xs, mean, linestyle=style, marker="o", ms=3, label=f"{g['label']} (n={len(runs)})")
            if len(runs) > 1:
                ax.fill_between(xs, [min(by_x[x]) for x in xs], [max(by_x[x]) for x in xs], alpha=0.2)
        ax.set(title=metric, xlabel="epoch", ylabel=metric)
        values = [v for c in (c for runs in curves for c in runs) for v in c.get(metric, {}).values()]
        scale, kwargs = y_scale(values)
        if scale != "linear":
            ax.set_yscale(scale, **kwargs)  # one diverging epoch would flatten every other line
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out_dir / f"{metric.replace('/', '_')}.png", dpi=100)
    return f"seqvae compare: wrote {len(metrics)} plots to {out_dir}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seqvae compare", description="Table of finished runs, one row per config over seeds.")
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR_OR_GLOB", help="run directories, or globs (quoted) matching them")
    parser.add_argument("--format", choices=["markdown", "csv", "json"], default="markdown")
    parser.add_argument(
        "--label", choices=["config", "dir"], default="config", help="row labels: varying config keys, or variant directory"
    )
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write one PNG per validation curve into DIR")
    args = parser.parse_args(argv)
    try:
        groups = group_runs(find_runs(args.runs), args.label)
    except (CompareError, OSError) as err:
        print(f"seqvae compare: error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(render(groups, args.format))
    if args.plots is not None:
        print(plot(groups, args.plots), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
