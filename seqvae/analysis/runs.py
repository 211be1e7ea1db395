"""Finished runs as `seqvae compare` reads them: a run directory's config.yaml and metrics.json
(a training run, or its export under docs/results/), a metric's values over runs (the metrics
are declared in seqvae/metric_spec.py), and which config keys say what a run is (grouping) and
which only how it was launched (ignored).
"""

from __future__ import annotations

import glob
import json
import math
import os
import statistics
import sys
from pathlib import Path

import yaml

from seqvae.metric_spec import Metric, mc_se_keys, metric
from seqvae.store.files import CONFIG
from seqvae.store.files import METRICS as METRICS_FILE
from seqvae.text.splits import fold_split_keys

# model.init_encoder_from names the stage-1 run of the same seed (freebits after autoencoder).
# The others change how a run is saved, launched or used after training, never its numbers;
# runs written before they existed must still group with runs written after.
IGNORED = (
    "seed_everything",
    "data.seed",
    "trainer.logger",
    "checkpoint",
    "ckpt_path",
    "trainer.default_root_dir",
    "model.init_encoder_from",
    "periodic_checkpoint",
    "model.generation",
    "trainer.use_distributed_sampler",
    "model.aggressive.init_args.seed",  # the run's seed since it defaults to seed_everything
    "data.vocab",  # a re-test reads the vocabulary from its checkpoint: the same one
    "verbose",  # `seqvae test`'s printing switch
    # what a run shows while it runs (TensorBoard text and images, a progress bar in a terminal)
    "text_samples",
    "latent_dimensions",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
)


KEPT = ("checkpoint.monitor",)
# Settings added after runs were recorded, with the value every run from before them used: a run
# written without the key groups with runs that set it to that value, and with no others. Which
# runs lacked which key is said under the table.
DEFAULTS_OF_NEWER_KEYS = {"model.init": "reference", "model.bn_eps": 1e-5}
# Switches added later whose default is what every earlier run did: dropped at that value, so
# runs from before and after group without a note under every table; only a run that turned
# one off shows it (`plateau.enabled=False`). `model.posterior: null` is the diagonal Gaussian
# that every run before that option used.
DROPPED_AT_DEFAULT = {"plateau.enabled": True, "model.posterior": None}
# Newer settings whose null (or absence, in runs written before them) means "the value of another
# key": resolved to that value, so a run from before the key, one that sets it null and one that
# sets it to the same number are the same config (nothing to note), and a row's label can say
# `encoder_hidden_dim=128` where another row has 256.
NULL_MEANS_KEY = {"model.encoder_hidden_dim": "model.hidden_dim"}
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


def as_seed(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_mapping(path: Path, name: str, read) -> dict:
    try:
        out = read((path / name).read_text()) or {}
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise CompareError(f"{path / name}: {' '.join(str(err).split())}") from err
    if not isinstance(out, dict):
        raise CompareError(f"{path}: config.yaml and metrics.json must each hold a mapping")
    return out


# A re-test (`seqvae test --ckpt_path`; its metrics.json names the `checkpoint`) decides these keys
# itself; every other setting is the checkpoint's. Its config.yaml holds the model's settings as
# the checkpoint saved them, but the test command's defaults for the rest (checkpoint.monitor,
# data.max_vocab, plateau.patience, ...), which say nothing of how the checkpoint was trained.
RETEST_OWN = (
    "data.test",
    "model.val_iw_samples",
    "model.test_iw_samples",
    "model.iw_max_elements",
    "model.mi_dataset",
    "model.eval_seed",
)


# The key a re-test whose training run is not here carries instead of the settings it cannot know.
UNKNOWN_TRAINING = "re-test, training run not found"


def training_run(checkpoint: str) -> Path | None:
    """The run directory that wrote `checkpoint` (`<run>/checkpoints/best.ckpt`), when it is here."""
    ckpt = Path(checkpoint)
    for run in (ckpt.parent.parent, ckpt.parent):
        if (run / CONFIG).is_file() and (run / METRICS_FILE).is_file():
            return run
    return None


def retest_settings(flat: dict, checkpoint: str) -> tuple[dict, str | None]:
    """A re-test's settings: its checkpoint's training run's, with the re-test's own (RETEST_OWN);
    without that run, the model's settings (the checkpoint's) and the re-test's own only."""
    own = {k: v for k, v in flat.items() if k in RETEST_OWN}
    run = training_run(checkpoint)
    if run is None:
        return {**{k: v for k, v in flat.items() if k.startswith("model.")}, **own, UNKNOWN_TRAINING: True}, None
    trained = {k: v for k, v in settings(read_mapping(run, CONFIG, yaml.safe_load))[0].items() if k not in RETEST_OWN}
    return {**trained, **own}, str(run)


def load_run(path: Path) -> dict:
    missing = [n for n in (CONFIG, METRICS_FILE) if not (path / n).is_file()]
    if missing:
        raise CompareError(f"{path}: not a run directory (no {' or '.join(missing)})")
    config = read_mapping(path, CONFIG, yaml.safe_load)
    metrics = read_mapping(path, METRICS_FILE, json.loads)
    flat, filled = settings(config)
    retest = None
    if isinstance(metrics.get("checkpoint"), str) and "fit_seconds" not in metrics:
        flat, trained = retest_settings(flat, metrics["checkpoint"])
        retest = {"checkpoint": metrics["checkpoint"], "training_run": trained}
    seeds = metrics.get("seeds") if isinstance(metrics.get("seeds"), dict) else {}
    seed = as_seed(config.get("seed_everything"))
    if seed is None:  # `seed_everything: true` draws one; the run records the one it drew
        seed = as_seed(seeds.get("seed_everything"))
    return {"path": path, "config": flat, "metrics": metrics, "seed": seed, "filled": filled, "retest": retest}


def settings(config: dict) -> tuple[dict, dict]:
    """A config.yaml's settings that say what a run is, flat, and the defaults filled into an older one."""
    flat = {k: v for k, v in flatten(config).items() if not ignored(k)}
    fold_split_keys(flat)  # `train: F` + `train_lines: 1-8000` (the older form) is `train: F#1-8000`
    if "data.label_column" in flat:  # `true` is the older spelling of `tab`; unset (null) reads as false
        flat["data.label_column"] = {True: "tab", None: False}.get(flat["data.label_column"], flat["data.label_column"])
    for key, source in NULL_MEANS_KEY.items():
        if flat.get(key) is None:
            flat.pop(key, None)
            if source in flat:
                flat[key] = flat[source]
    for key, default in DROPPED_AT_DEFAULT.items():
        if key in flat and flat[key] == default:
            del flat[key]
    filled = {}
    if "model" in config:
        filled = {k: v for k, v in DEFAULTS_OF_NEWER_KEYS.items() if k not in flat}
        flat = {**filled, **flat}
    return flat, filled


def find_runs(patterns: list[str], option: str | None = None, program: str = "seqvae compare") -> list[dict]:
    """The run directories matching the patterns, in order; `option` names the one they came from,
    `program` the command whose notice this is."""
    where = f"{option} " if option else ""
    paths: list[Path] = []
    for pattern in patterns:
        matches = [pattern] if os.path.isdir(pattern) else sorted(p for p in glob.glob(pattern) if os.path.isdir(p))
        if not matches:
            message = f"{option} {pattern!r}: no run directories match" if option else f"no run directories match {pattern!r}"
            raise CompareError(message)
        paths += [Path(m) for m in matches if Path(m).resolve() not in {p.resolve() for p in paths}]
    runs, skipped = [], []
    named = {Path(p).resolve() for p in patterns if os.path.isdir(p)}
    for p in paths:
        if p.resolve() not in named and not (p / METRICS_FILE).is_file():
            skipped.append(p)  # a glob also matches predict runs, unfinished, failed (`failed-seed2`) and empty ones
            continue
        try:
            runs.append(load_run(p))
        except CompareError as err:
            raise CompareError(f"{where}{err}") from None
    if skipped:
        names = ", ".join(str(p) for p in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
        print(
            f"{program}: skipped {len(skipped)} directories without metrics.json (predict, unfinished, failed or empty): {names}",
            file=sys.stderr,
        )
    if not runs:
        raise CompareError(f"{where}{' '.join(patterns)}: no finished runs (no metrics.json)")
    return runs


def test_texts(run: dict) -> str | None:
    """The run's `test_texts_sha256` (what it was tested on); None for runs from before it was recorded."""
    digest = run["metrics"].get("test_texts_sha256")
    return digest if isinstance(digest, str) and digest else None


def texts_digests(runs: list[dict]) -> list[str]:
    """The distinct test text digests of the runs that record one, sorted."""
    return sorted({d for d in map(test_texts, runs) if d})


def value(run: dict, mid: str) -> float | None:
    m = metric(mid)
    v = run["metrics"].get(m.key)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return None
    return v / m.divide_by if m.divide_by != 1 else float(v)


def summarize(runs: list[dict], m: Metric) -> dict:
    """Mean and s.d. over the runs' finite values of metric `m`; "n" (the runs that have one) when
    some lack it, and "nonfinite" (how many runs record NaN/inf, left out) when any do."""
    key = m.key
    numbers = [r["metrics"][key] for r in runs if isinstance(r["metrics"].get(key), (int, float))]
    values = [float(v) for v in numbers if not isinstance(v, bool) and math.isfinite(v)]
    bad = len(numbers) - len(values)
    if m.divide_by != 1:
        values = [v / m.divide_by for v in values]
    if key in mc_se_keys():  # a run's Monte-Carlo s.e.: its root mean square over the row's runs
        out = {"mean": math.sqrt(statistics.fmean(v * v for v in values)) if values else None, "std": None}
    else:
        out = {"mean": statistics.fmean(values) if values else None, "std": statistics.stdev(values) if len(values) > 1 else None}
    if values and len(values) < len(runs):
        out["n"] = len(values)
    if bad:
        out["nonfinite"] = bad
    return out


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


def test_texts_notes(groups: list[dict]) -> list[str]:
    """One line per row whose runs were tested on different texts (runs that do not record theirs aside)."""
    lines = []
    for g in groups:
        digests = texts_digests(g["runs"])
        if len(digests) < 2:
            continue
        unknown = sum(test_texts(r) is None for r in g["runs"])
        aside = f"; {unknown} run(s) do not record it" if unknown else ""
        lines.append(
            f"{g['label']}: its {len(g['runs'])} runs were tested on {len(digests)} different sets of texts "
            f"(test_texts_sha256 differ{aside}): its mean mixes test sets"
        )
    return lines


# ---------------------------------------------------------------- runs whose evaluation checks broke

# A check that qualifies a run's numbers (`seqvae/core/eval_checks.py`: BN-VAE's bound `bn_bound`,
# WAE-RNF's heads `rnf_bn_heads`) leaves a record in metrics.json: a dict with `broken`, and since
# the records describe themselves, `title` and `consequence`. In a run whose record is broken the
# posterior metrics (metric_spec's `bn_sensitive`) are marked.
CHECK_MARK = "†"
# Records written before they described themselves: BN-VAE's bound was the only check then (its text as
# core/bn_bound.py's TITLE and CONSEQUENCE, repeated: this room is torch-free and cannot import core).
UNTITLED = {
    "bn_bound": (
        "BN-VAE bound broken",
        "their KL, AU, MI, IW-NLL, PPL, −ELBO and μ erank are not BN-VAE's (raw means vary by less than 10·bn_eps)",
    )
}


def broken_checks(run: dict) -> list[str]:
    """The metrics.json keys of this run's check records that say broken."""
    return [k for k, v in run["metrics"].items() if isinstance(v, dict) and v.get("broken") is True]


def check_broken(run: dict) -> bool:
    """Whether any check of this run broke (its posterior metrics are marked)."""
    return bool(broken_checks(run))


def marks_every_metric(run: dict) -> bool:
    """Whether a broken record of this run qualifies every metric, not only the posterior's (a partial
    test, `rundir/results.py`: `"marks": "all"`)."""
    return any(run["metrics"][k].get("marks") == "all" for k in broken_checks(run))


def check_title(run: dict, key: str) -> tuple[str, str]:
    record = run["metrics"][key]
    fallback = UNTITLED.get(key, (f"check {key} broken", "their posterior metrics are qualified"))
    return record.get("title", fallback[0]), record.get("consequence", fallback[1])


def check_notes(groups: list[dict]) -> list[str]:
    """The footnotes of the † marks: per broken check, the rows (and runs) where it broke."""
    by_key: dict[str, tuple[tuple[str, str], list[str]]] = {}
    for g in groups:
        keys = {k for r in g["runs"] for k in broken_checks(r)}
        for key in sorted(keys):
            broken = [r for r in g["runs"] if key in broken_checks(r)]
            runs = f"all {len(broken)}" if len(broken) == len(g["runs"]) else ", ".join(r["path"].name for r in broken)
            title = check_title(broken[0], key)
            by_key.setdefault(key, (title, []))[1].append(f"{g['label']} ({runs})" if len(g["runs"]) > 1 else g["label"])
    return [
        f"{CHECK_MARK} {title} in runs {'; '.join(which)}: see metrics.json {key}; {consequence}"
        for key, ((title, consequence), which) in by_key.items()
    ]


def repeated_seed_notes(groups: list[dict]) -> list[str]:
    """Runs of one config with the same seed (a copy, a resumed twin): not independent replicates."""
    notes = []
    for g in groups:
        by_seed: dict = {}
        for r in g["runs"]:
            if r["seed"] is not None:
                by_seed.setdefault(r["seed"], []).append(str(r["path"]))
        for seed, paths in by_seed.items():
            if len(paths) > 1:
                notes.append(
                    f"{g['label']}: {len(paths)} runs with seed {seed} ({', '.join(paths)}): one config and one seed are "
                    "not independent replicates (a copy or a re-run?); n and the s.d. count them as separate runs: "
                    "leave all but one out"
                )
    return notes
