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
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import math
import os
import statistics
import sys
from pathlib import Path

import yaml

# (id used in CSV/JSON, markdown header, metrics.json key, digits)
METRICS = [
    ("iw_nll", "IW-NLL", "test/iw_nll", 2),
    ("iw_nll_se", "IW-NLL MC se", "test/iw_nll_se", 2),
    ("neg_elbo", "−ELBO", "test/loss", 2),
    ("kl", "KL", "test/kl", 2),
    ("mi", "MI", "test/mi", 2),
    ("mi_dataset", "MI(dataset)", "test/mi_dataset", 2),
    ("mi_dataset_se", "MI(dataset) MC se", "test/mi_dataset_se", 3),
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
KEY = {mid: key for mid, _, key, _ in METRICS}
HEADER = {mid: header for mid, header, _, _ in METRICS}
DIGITS = {mid: digits for mid, _, _, digits in METRICS}
# Metrics that get a difference to the baseline, and the per-text column of those paired by text.
DIFF_METRICS = ("iw_nll", "neg_elbo", "kl", "mi", "mi_dataset", "au", "iw_ppl")
PER_TEXT = {"iw_nll": "iw_nll", "neg_elbo": "neg_elbo", "kl": "kl"}
PER_TEXT_COLUMNS = ("index", "line", "tokens", "neg_elbo", "kl", "iw_nll", "iw_se")
# Monte-Carlo standard error of a run's own value (importance / z sampling), when metrics.json has it.
MC_SE = {"iw_nll": "iw_nll_se", "mi_dataset": "mi_dataset_se"}
# A difference in JSON: diff (row − baseline), 95% bounds lo/hi, n pairs (texts, seeds) or runs, df of the
# t quantile, by ("text", "seed", "welch" or None), why there is no interval, MC se of a one-run difference.
DIFF_KEYS = dict.fromkeys(("diff", "lo", "hi", "n", "df", "by", "why", "mc_se", "excludes_zero"))
# model.init_encoder_from names the stage-1 run of the same seed (freebits after autoencoder).
# The others change how a run is saved, launched or used after training, never its numbers;
# runs written before they existed must still group with runs written after.
IGNORED = (
    "seed_everything", "data.seed", "trainer.logger", "checkpoint", "ckpt_path", "trainer.default_root_dir",
    "model.init_encoder_from", "periodic_checkpoint", "model.generation", "trainer.use_distributed_sampler",
    "model.aggressive.init_args.seed",  # the run's seed since it defaults to seed_everything
    "data.vocab",  # a re-test reads the vocabulary from its checkpoint: the same one
)  # fmt: skip
KEPT = ("checkpoint.monitor",)
# Settings added after runs were recorded, with the value every run from before them used: a run
# written without the key groups with runs that set it to that value, and with no others. Which
# runs lacked which key is said under the table.
DEFAULTS_OF_NEWER_KEYS = {"model.init": "reference", "model.bn_eps": 1e-5}
MISSING = "–"

# Two-sided 95% quantiles of Student's t, t(0.975, df), for df 1..30; beyond, the Cornish-Fisher
# expansion around the normal quantile (its P(T < t) is off by < 1e-8 from df 31 on; tests/test_compare.py).
T975 = (
    12.706204736, 4.302652730, 3.182446305, 2.776445105, 2.570581836, 2.446911851, 2.364624252, 2.306004135,
    2.262157163, 2.228138852, 2.200985160, 2.178812830, 2.160368656, 2.144786688, 2.131449546, 2.119905299,
    2.109815578, 2.100922040, 2.093024054, 2.085963447, 2.079613845, 2.073873068, 2.068657610, 2.063898562,
    2.059538553, 2.055529439, 2.051830516, 2.048407142, 2.045229642, 2.042272456,
)  # fmt: skip


class CompareError(Exception):
    pass


def t975(df: float) -> float:
    """t(0.975, df); a fractional df (Welch) is rounded down, which widens the interval."""
    df = int(math.floor(df))
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    g = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


def t_interval(d: list[float]) -> dict:
    """mean(d) ± t(0.975, n−1)·sd(d)/√n; no bounds for fewer than 2 values."""
    n = len(d)
    mean = statistics.fmean(d) if d else None
    if n < 2:
        return {"diff": mean, "lo": None, "hi": None, "n": n}
    half = t975(n - 1) * statistics.stdev(d) / math.sqrt(n)
    return {"diff": mean, "lo": mean - half, "hi": mean + half, "n": n, "df": n - 1}


def welch_interval(a: list[float], b: list[float]) -> dict:
    """mean(a) − mean(b) ± t(0.975, ν)·√(s_a²/n_a + s_b²/n_b), ν by Welch–Satterthwaite (rounded down)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "n": len(a) + len(b), "df": len(a) + len(b) - 2}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t975(df) * math.sqrt(va + vb)
    return {"diff": diff, "lo": diff - half, "hi": diff + half, "n": len(a) + len(b), "df": math.floor(df)}


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


def as_seed(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_run(path: Path) -> dict:
    missing = [n for n in ("config.yaml", "metrics.json") if not (path / n).is_file()]
    if missing:
        raise CompareError(f"{path}: not a run directory (no {' or '.join(missing)})")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text()) or {}
        metrics = json.loads((path / "metrics.json").read_text())
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise CompareError(f"{path}: {' '.join(str(err).split())}") from err
    if not isinstance(config, dict) or not isinstance(metrics, dict):
        raise CompareError(f"{path}: config.yaml and metrics.json must each hold a mapping")
    flat = {k: v for k, v in flatten(config).items() if not ignored(k)}
    filled = {}
    if "model" in config:
        filled = {k: v for k, v in DEFAULTS_OF_NEWER_KEYS.items() if k not in flat}
        flat = {**filled, **flat}
    seeds = metrics.get("seeds") if isinstance(metrics.get("seeds"), dict) else {}
    seed = as_seed(config.get("seed_everything"))
    if seed is None:  # `seed_everything: true` draws one; the run records the one it drew
        seed = as_seed(seeds.get("seed_everything"))
    return {"path": path, "config": flat, "metrics": metrics, "seed": seed, "filled": filled}


def find_runs(patterns: list[str], option: str | None = None) -> list[dict]:
    """The run directories matching the patterns, in order; `option` names the one they came from."""
    where = f"{option} " if option else ""
    paths: list[Path] = []
    for pattern in patterns:
        matches = [pattern] if os.path.isdir(pattern) else sorted(p for p in glob.glob(pattern) if os.path.isdir(p))
        if not matches:
            message = f"{option} {pattern!r}: no run directories match" if option else f"no run directories match {pattern!r}"
            raise CompareError(message)
        paths += [Path(m) for m in matches if Path(m).resolve() not in {p.resolve() for p in paths}]
    runs = []
    for p in paths:
        try:
            runs.append(load_run(p))
        except CompareError as err:
            raise CompareError(f"{where}{err}") from None
    return runs


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


def varying_keys(groups: list[dict]) -> list[str]:
    keys = sorted({k for g in groups for k in g["config"]})
    return [k for k in keys if len({json.dumps(g["config"].get(k, "<absent>"), default=str) for g in groups}) > 1]


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
    varying = varying_keys(out)
    names = short_names(varying)
    for g in out:
        label = ", ".join(f"{names[k]}={show(k, g['config'][k])}" for k in varying if k in g["config"])
        parents = dict.fromkeys(r["path"].resolve().parent.name for r in g["runs"])
        g["label"] = ",".join(parents) if label_by == "dir" or not label else label
        g["stats"] = {mid: summarize(g["runs"], key) for mid, _, key, _ in METRICS}
    return out


def value(run: dict, mid: str) -> float | None:
    v = run["metrics"].get(KEY[mid])
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return v / 60 if mid == "train_minutes" else float(v)


def summarize(runs: list[dict], key: str) -> dict:
    values = [float(r["metrics"][key]) for r in runs if isinstance(r["metrics"].get(key), (int, float))]
    if key == "fit_seconds":
        values = [v / 60 for v in values]
    if key.endswith("_se"):  # a run's Monte-Carlo s.e.: its root mean square over the row's runs
        return {"mean": math.sqrt(statistics.fmean(v * v for v in values)) if values else None, "std": None}
    return {
        "mean": statistics.fmean(values) if values else None,
        "std": statistics.stdev(values) if len(values) > 1 else None,
    }


# ---------------------------------------------------------------- differences to the baseline


def read_per_text(run: dict) -> tuple[dict[int, dict] | None, str]:
    """index -> {column: float} from the run's per-text file; (None, why) when it has none."""
    name = run["metrics"].get("per_text_file")
    if not name:
        return None, f"{run['path']} has no per-text file"
    path = run["path"] / name
    if not path.is_file():
        return None, f"{path} is missing"
    rows: dict[int, dict] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        absent = [c for c in PER_TEXT_COLUMNS if c in ("index", *PER_TEXT.values()) and c not in (reader.fieldnames or [])]
        if absent:
            raise CompareError(f"{path}: no column {', '.join(absent)} (expected {','.join(PER_TEXT_COLUMNS)})")
        for line, row in enumerate(reader, start=2):
            try:
                index = int(row["index"])
                values = {c: float(row[c]) for c in PER_TEXT.values()}
            except (TypeError, ValueError):
                raise CompareError(f"{path}:{line}: not a number in {dict(row)}") from None
            if index in rows:
                raise CompareError(f"{path}:{line}: index {index} occurs twice")
            rows[index] = values
    return rows, ""


def texts_pairing(a: dict, b: dict) -> tuple[tuple[dict, dict] | None, str]:
    """The two runs' per-text rows when they were tested on the same texts; else (None, why)."""
    ta, why = read_per_text(a)
    if ta is None:
        return None, why
    tb, why = read_per_text(b)
    if tb is None:
        return None, why
    da, db = a["metrics"].get("test_texts_sha256"), b["metrics"].get("test_texts_sha256")
    if not da or not db:
        return None, f"{(a if not da else b)['path']}: metrics.json has no test_texts_sha256"
    if da != db:
        return None, f"different test texts (test_texts_sha256 {da[:12]}… vs {db[:12]}…)"
    if set(ta) != set(tb):
        return None, f"the per-text files have different rows ({len(ta)} vs {len(tb)} texts, {len(set(ta) ^ set(tb))} unmatched)"
    return (ta, tb), ""


def excludes_zero(d: dict) -> bool | None:
    if d.get("lo") is None:
        return None
    return d["lo"] > 0 or d["hi"] < 0


def seed_map(runs: list[dict]) -> dict[int, dict]:
    """seed -> run, for the seeds that occur once in the group."""
    seeds = [r["seed"] for r in runs]
    return {r["seed"]: r for r in runs if r["seed"] is not None and seeds.count(r["seed"]) == 1}


def seeds_text(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def k_note(a: list[dict], b: list[dict]) -> str:
    ka = sorted({r["metrics"].get("iw_samples") for r in a if r["metrics"].get("iw_samples") is not None})
    kb = sorted({r["metrics"].get("iw_samples") for r in b if r["metrics"].get("iw_samples") is not None})
    if ka and kb and ka != kb:
        return f"; IW-NLL with different K ({'/'.join(map(str, ka))} vs {'/'.join(map(str, kb))} importance samples)"
    return ""


def differences(g: dict, base: dict) -> tuple[dict, str, str]:
    """({metric id: difference}, short pairing for the table, what was paired and n: one line after "ROW: ")."""
    blabel = base["label"]
    rows, brows = g["runs"], base["runs"]
    rmap, bmap = seed_map(rows), seed_map(brows)
    common = sorted(set(rmap) & set(bmap))
    out: dict[str, dict] = {}
    if len(rows) > 1 and len(brows) > 1 and len(common) > 1:
        for mid in DIFF_METRICS:
            pairs = [(value(rmap[s], mid), value(bmap[s], mid)) for s in common]
            d = [x - y for x, y in pairs if x is not None and y is not None]
            out[mid] = {**t_interval(d), "by": "seed"} if d else {"diff": None}
            if len(d) == 1:
                out[mid]["why"] = "one common seed has it"
        n = len(common)
        dropped = len(rows) + len(brows) - 2 * n
        extra = f"; {dropped} run(s) without a partner of the same seed left out" if dropped else ""
        line = f"paired by seed with {blabel}, seeds {seeds_text(common)} (n = {n}, t(0.975, {n - 1}) = {t975(n - 1):.3f}){extra}"
        return out, f"seed, n={n}", line + k_note(rows, brows)
    if len(rows) > 1 and len(brows) > 1:
        for mid in DIFF_METRICS:
            a = [v for v in (value(r, mid) for r in rows) if v is not None]
            b = [v for v in (value(r, mid) for r in brows) if v is not None]
            if len(a) > 1 and len(b) > 1:
                out[mid] = {**welch_interval(a, b), "by": "welch"}
            else:
                diff = statistics.fmean(a) - statistics.fmean(b) if a and b else None
                out[mid] = {"diff": diff, "why": "fewer than 2 runs of a side have it"}
        why = "no seed in common" if not common else f"only seed {common[0]} in common"
        line = f"not paired ({why}): unpaired Welch interval, {len(rows)} vs {len(brows)} runs (df rounded down)"
        return out, f"unpaired, n={len(rows)}+{len(brows)}", line + k_note(rows, brows)
    # One run on at least one side: that run against the other side's run of the same seed.
    if len(rows) == 1 and len(brows) == 1:
        pair = (rows[0], brows[0])
    elif common:
        pair = (rmap[common[0]], bmap[common[0]])
    else:
        pair = None
    if pair is None:
        for mid in DIFF_METRICS:
            m, bm = g["stats"][mid]["mean"], base["stats"][mid]["mean"]
            out[mid] = {"diff": None if None in (m, bm) else m - bm, "why": "no pairing"}
        own = seeds_text(sorted({r["seed"] for r in rows if r["seed"] is not None})) or "unknown"
        runs_text = f"{len(rows)} run{'s' * (len(rows) > 1)} (seed{'s' * (',' in own)} {own})"
        line = f"not paired: {runs_text} and no {blabel} run of the same seed; difference of the means, no interval"
        return out, MISSING, line + k_note(rows, brows)
    a, b = pair
    which = f"seed {a['seed']}" if a["seed"] is not None else a["path"].name
    bwhich = f"seed {b['seed']}" if b["seed"] is not None else b["path"].name
    texts, why = texts_pairing(a, b)
    for mid in DIFF_METRICS:
        va, vb = value(a, mid), value(b, mid)
        if mid in PER_TEXT and texts is not None:
            ta, tb = texts
            col = PER_TEXT[mid]
            d = [ta[i][col] - tb[i][col] for i in sorted(ta) if math.isfinite(ta[i][col]) and math.isfinite(tb[i][col])]
            out[mid] = {**t_interval(d), "by": "text"} if d else {"diff": None, "why": f"{col} is nan for every text"}
            continue
        out[mid] = {"diff": None if None in (va, vb) else va - vb, "n": 1, "why": "one run per side"}
        se = MC_SE.get(mid)
        if se and None not in (value(a, se), value(b, se)):
            out[mid]["mc_se"] = math.hypot(value(a, se), value(b, se))
    head = f"{which} vs {blabel} {bwhich}"
    if texts is not None:
        n = out["neg_elbo"].get("n") or 0
        t = f"t(0.975, {n - 1}) = {t975(n - 1):.3f}" if n > 1 else "no interval"
        n_iw = out["iw_nll"].get("n") or 0
        iw = f"; IW-NLL on the {n_iw} texts both have it for" if n_iw != n else ""
        line = (f"{head}: IW-NLL, −ELBO, KL paired by test text (n = {n} texts, {t}{iw}); "
                "MI, MI(dataset), AU, PPL: n/a, one run per side")  # fmt: skip
        short = f"text, n={n}"
    else:
        line = f"{head}: not paired by text ({why}); one run per side: differences only, n/a"
        short = "one run each"
    return out, short, line + k_note([a], [b])


def diff_cell(d: dict | None, digits: int) -> str:
    if not d or d.get("diff") is None:
        return MISSING
    text = f"{d['diff']:+.{digits}f}"
    if d.get("lo") is not None:
        return f"{text} [{d['lo']:+.{digits}f}, {d['hi']:+.{digits}f}]" + ("*" if excludes_zero(d) else "")
    return f"{text} (n/a; MC se {d['mc_se']:.{digits}f})" if d.get("mc_se") is not None else f"{text} (n/a)"


def add_differences(groups: list[dict]) -> list[str]:
    """Fills g["difference"] and g["paired_by"] for every non-baseline group; returns the pairing lines."""
    base = next((g for g in groups if g["baseline"]), None)
    if base is None:
        return []
    lines: dict[str, list[str]] = {}  # rows paired the same way share one line
    for g in groups:
        if g is base:
            continue
        diff, short, line = differences(g, base)
        for mid, d in diff.items():  # every difference has every key (None when it does not apply)
            diff[mid] = {**DIFF_KEYS, **d, "excludes_zero": excludes_zero(d)}
        g["difference"], g["paired_by"], g["pairing"] = diff, short, line
        lines.setdefault(line, []).append(g["label"])
    return [f"{', '.join(labels)}: {line}" for line, labels in lines.items()]


# ---------------------------------------------------------------- notes and warnings


def commit_warning(runs: list[dict]) -> str | None:
    """One line when the runs do not all come from one clean commit (or do not say)."""
    versions: dict[str, int] = {}
    for r in runs:
        p = r["metrics"].get("provenance")
        commit = p.get("git_commit") if isinstance(p, dict) else None
        name = "unknown" if not commit else str(commit)[:7] + ("+dirty" if p.get("git_dirty") else "")
        versions[name] = versions.get(name, 0) + 1
    if len(versions) == 1 and not any(v == "unknown" or v.endswith("+dirty") for v in versions):
        return None
    if list(versions) == ["unknown"]:
        return f"none of the {len(runs)} runs records its commit (no provenance in metrics.json)"
    listed = ", ".join(f"{v} ×{n}" for v, n in sorted(versions.items(), key=lambda kv: (kv[0] == "unknown", kv[0])))
    what = f"{len(versions)} commits" if len(versions) > 1 else "1 commit"
    why = []
    if "unknown" in versions:
        why.append("unknown: metrics.json has no provenance")
    if any(v.endswith("+dirty") for v in versions):
        why.append("+dirty: with uncommitted changes")
    return f"runs come from {what} ({listed})" + (f"; {'; '.join(why)}" if why else "")


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


# ---------------------------------------------------------------- output


def run_json(r: dict) -> dict:
    return {
        "path": str(r["path"]),
        "seed": r["seed"],
        "provenance": r["metrics"].get("provenance"),
        "seeds": r["metrics"].get("seeds"),
        "filled_in": r["filled"],
    }


def render_json(groups: list[dict], pairings: list[str], warnings: list[str]) -> str:
    rows = []
    for g in groups:
        row = {"label": g["label"], "n": len(g["runs"]), "baseline": g["baseline"], "runs": [run_json(r) for r in g["runs"]]}
        row.update(g["stats"])
        if "difference" in g:
            row["paired_by"] = g["paired_by"]
            row["pairing"] = g["pairing"]
            row["difference"] = g["difference"]
        rows.append(row)
    base = next((g["label"] for g in groups if g["baseline"]), None)
    doc = {"rows": rows, "baseline": base, "pairings": pairings, "warnings": warnings}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def render_csv(groups: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    with_diff = any(g["baseline"] for g in groups)
    header = ["label", "n", *(f"{mid}_{s}" for mid, *_ in METRICS for s in ("mean", "std"))]
    if with_diff:
        header += ["baseline", "paired_by", *(f"{mid}_diff_{s}" for mid in DIFF_METRICS for s in ("mean", "lo", "hi", "n"))]
    writer.writerow(header)
    for g in groups:
        stats = [g["stats"][mid][s] for mid, *_ in METRICS for s in ("mean", "std")]
        row = [g["label"], len(g["runs"]), *("" if v is None else repr(v) for v in stats)]
        if with_diff:
            diff = g.get("difference", {})
            cells = [diff.get(mid, {}).get(s) for mid in DIFF_METRICS for s in ("diff", "lo", "hi", "n")]
            row += [int(g["baseline"]), g.get("paired_by", ""), *("" if v is None else repr(v) for v in cells)]
        writer.writerow(row)
    return buf.getvalue()


def cell(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return MISSING
    text = f"{stat['mean']:.{digits}f}"
    return text if stat["std"] is None else f"{text} ± {stat['std']:.{digits}f}"


def escape(label: str) -> str:
    return label.replace("|", "\\|")


def render_table(groups: list[dict]) -> list[str]:
    # Markdown is for reading: a metric column no run has (e.g. one added after the runs) is left out.
    shown = [(mid, h, d) for mid, h, _, d in METRICS if any(g["stats"][mid]["mean"] is not None for g in groups)]
    headers = [h for mid, h, _ in shown if mid not in ("encoder_updates", "decoder_updates", "train_minutes")]
    headers += ["enc / dec updates", "train minutes"]
    lines = ["| run | n | " + " | ".join(headers) + " |", "|---" * (len(headers) + 2) + "|"]
    for g in groups:
        cells = {mid: cell(g["stats"][mid], digits) for mid, _, _, digits in METRICS}
        updates = f"{cells.pop('encoder_updates')} / {cells.pop('decoder_updates')}"
        minutes = cells.pop("train_minutes")
        values = [cells[mid] for mid, _, _ in shown if mid in cells]
        lines.append(f"| {escape(g['label'])} | {len(g['runs'])} | " + " | ".join([*values, updates, minutes]) + " |")
    return lines


def render_differences(groups: list[dict]) -> list[str]:
    base = next(g for g in groups if g["baseline"])
    se_cols = [se for se in MC_SE.values() if any(g["stats"][se]["mean"] is not None for g in groups)]
    headers = [HEADER[mid] for mid in DIFF_METRICS] + [HEADER[mid] for mid in se_cols]
    lines = [
        f"Differences to the baseline {escape(base['label'])}: row − baseline, mean [95% interval]; "
        "* the interval excludes 0; n/a: no interval (the line under the table says why). "
        "The baseline row shows its own mean ± s.d." + (" MC se: each row's own Monte-Carlo standard error." if se_cols else ""),
        "",
        "| run | n | paired by | " + " | ".join(headers) + " |",
        "|---" * (len(headers) + 3) + "|",
    ]
    for g in groups:
        if g["baseline"]:
            cells = [cell(g["stats"][mid], DIGITS[mid]) for mid in DIFF_METRICS]
            label, paired = f"{escape(g['label'])} (baseline)", MISSING
        else:
            cells = [diff_cell(g["difference"].get(mid), DIGITS[mid]) for mid in DIFF_METRICS]
            label, paired = escape(g["label"]), g["paired_by"]
        cells += [cell(g["stats"][mid], DIGITS[mid]) for mid in se_cols]
        lines.append(f"| {label} | {len(g['runs'])} | {paired} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(groups: list[dict], pairings: list[str], notes: list[str]) -> str:
    lines = render_differences(groups) if any(g["baseline"] for g in groups) else render_table(groups)
    # A blank line ends the table (a text line right under it would be read as one more row).
    footer = [f"- {line}" for line in [*pairings, *notes]]
    if footer:
        lines += ["", *footer]
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
    parser.add_argument("--plots", type=Path, metavar="DIR", help="write one PNG per validation curve into DIR")
    args = parser.parse_args(argv)
    try:
        runs = find_runs(args.runs)
        baseline = find_runs([args.baseline], option="--baseline") if args.baseline is not None else None
        groups = group_runs(runs, args.label, baseline, repr(args.baseline))
        pairings = add_differences(groups)
    except (CompareError, OSError) as err:
        print(f"seqvae compare: error: {err}", file=sys.stderr)
        return 2
    notes = filled_in_notes(groups)
    commits = commit_warning([r for g in groups for r in g["runs"]])
    if commits:
        print(f"seqvae compare: warning: {commits}", file=sys.stderr)
    if args.format == "json":
        sys.stdout.write(render_json(groups, pairings, [*([commits] if commits else []), *notes]))
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
