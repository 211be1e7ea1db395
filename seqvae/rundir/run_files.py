"""What a run writes beside its checkpoints, never replacing a file: metrics.json and
per_text.csv (numbered together: metrics-2.json + per_text-2.csv for a re-test), written
atomically (`files.atomic_write_text`); and its settings with its test metrics as TensorBoard HPARAMS records.
"""

from __future__ import annotations

from pathlib import Path

from seqvae.metric_spec import PER_TEXT_LEAD, SPEC, per_text_columns
from seqvae.store.files import atomic_write_text


def numbered(path: Path, n: int) -> Path:
    return path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")


def free_number(paths) -> int:
    """The first n for which none of the numbered paths exists (1: the paths themselves)."""
    n = 1
    while any(numbered(p, n).exists() for p in paths):
        n += 1
    return n


def write_new_files(texts: dict[Path, str], n: int | None = None) -> dict[Path, Path]:
    """Writes each text to its path, never replacing an existing file: all get the same number
    (`metrics.json` + `per_text.csv`, else `metrics-2.json` + `per_text-2.csv`, …), the first
    free for every one of them. Written in the given order (the last, metrics.json, marks the
    set complete). Returns {path asked: path written}."""
    n = n or free_number(texts)
    for path, text in texts.items():
        atomic_write_text(numbered(path, n), text)
    return {p: numbered(p, n) for p in texts}


def write_new_file(path: Path, text: str) -> Path:
    """Writes `text` at `path`, or `path-2`, … if taken; never replaces a file."""
    return write_new_files({path: text})[path]


def _described(obj) -> str:
    """A strategy object as its class and settings: `LinearKLWarmup(start=0.1, warmup_epochs=10)`."""
    if obj is None:
        return "none"
    state = obj.__getstate__() if hasattr(obj, "__getstate__") else None
    state = state if isinstance(state, dict) else vars(obj)
    settings = ", ".join(f"{k}={v}" for k, v in sorted(state.items()) if not k.startswith("_") and k not in ("seed", "rng"))
    return f"{type(obj).__name__}({settings})"


def run_hparams(model, seed) -> dict:
    """What a run is, flattened to readable names and plain values for TensorBoard's HPARAMS tab."""
    h = model.hparams
    return {
        "pooling": h.pooling if h.latent_dim else "none (LM)",
        "feature_norm": repr(h.get("feature_norm")) if h.get("feature_norm") is not None else "none",
        "encoder": repr(h.get("encoder")) if h.get("encoder") is not None else ("LSTM" if h.latent_dim else "none (LM)"),
        "kl_schedule": _described(model.kl_schedule),
        "kl_penalty": _described(model.kl_penalty),
        "regularizers": " + ".join(_described(r) for r in model.regularizers) or "none",
        "aggressive": _described(model.aggressive) if model.aggressive is not None else "off",
        "word_dropout": float(h.word_dropout),
        "skip": bool(h.skip),
        "bn_gamma": float(h.bn_gamma) if h.bn_gamma is not None else 0.0,
        "init": h.init,
        "embed_dim": int(h.embed_dim),
        "hidden_dim": int(h.hidden_dim),
        "encoder_hidden_dim": int(h.get("encoder_hidden_dim") or h.hidden_dim),
        "latent_dim": int(h.latent_dim),
        "lr": float(h.lr),
        "seed": int(seed) if isinstance(seed, int) else -1,
    }


def log_hparams(logger, params: dict, metrics: dict) -> None:
    """Writes the hparams plugin's records into the run's TensorBoard events: its settings, and
    which test scalars (already in the events) are its metrics. Directly, not through
    `logger.log_hyperparams`, which would also rewrite hparams.yaml with these names."""
    from torch.utils.tensorboard.summary import hparams

    experiment = getattr(logger, "experiment", None)
    if experiment is None or not hasattr(experiment, "_get_file_writer"):
        return
    shown = {m.key: metrics[m.key] for m in SPEC if m.hparam and m.key in metrics}  # metric_spec's `hparam`
    writer = experiment._get_file_writer()
    for summary in hparams(params, shown):
        writer.add_summary(summary)
    experiment.flush()


def per_text_csv(rows: dict, line_numbers: list[int], labels: list[str | None] | None = None) -> str:
    """One row per test text, by position in the test split: its line in the test file, its
    predicted tokens, then the per-text metrics (metric_spec's `per_text`: −ELBO and KL of one z
    sample, IW-NLL and the IW-NLL's Monte-Carlo s.e., ...); and its label, last, where the test
    file has labels (`data.label_column`). `rows`: EvalMetrics.per_text_rows()."""
    labelled = labels is not None and any(label is not None for label in labels)
    # a metric measured only in some tests (AIS: `model.ais`) has its column only where it ran
    columns = tuple(c for i, c in enumerate(per_text_columns()) if i < len(PER_TEXT_LEAD) or c in rows)
    out = [",".join(columns + ("label",) * labelled)]
    values = columns[len(PER_TEXT_LEAD) :]
    cols = [rows[k].tolist() for k in ("index", "tokens", *values)]
    for i, tokens, *metric_values in zip(*cols):
        row = ",".join([f"{int(i)},{line_numbers[int(i)]},{int(tokens)}", *(f"{v:.6f}" for v in metric_values)])
        out.append(row + (f",{csv_field(labels[int(i)] or '')}" if labelled else ""))
    return "\n".join(out) + "\n"


def csv_field(text: str) -> str:
    """A label as a CSV field: quoted where it holds a comma, quote or line break."""
    return f'"{text.replace(chr(34), chr(34) * 2)}"' if any(c in text for c in ',"\r\n') else text


def drop_empty_event_files(run_dir: Path) -> int:
    """Removes the run's TensorBoard event files that hold nothing but their header (what a
    predict run's logger leaves): TensorBoard would list the run with no data. Returns how many."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    dropped = 0
    for path in sorted(Path(run_dir).glob("events.out.tfevents.*")):
        if all(event.WhichOneof("what") == "file_version" for event in EventFileLoader(str(path)).Load()):
            path.unlink()
            dropped += 1
    return dropped
