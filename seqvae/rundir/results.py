"""What a run writes into its directory once it has been tested or has predicted, as the CLI's
after_fit/after_test/after_predict call it: metrics.json with per_text.csv (never replacing a
set: metrics-2.json + per_text-2.csv, …), the TensorBoard HPARAMS records, curves.csv after
`fit`, and predictions.txt (predictions-2.txt, …).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from seqvae.metric_spec import TEST, undeclared
from seqvae.rundir.provenance import provenance
from seqvae.rundir.run_dir_callbacks import PerTextRows
from seqvae.rundir.run_files import (
    drop_empty_event_files,
    free_number,
    log_hparams,
    numbered,
    per_text_csv,
    run_hparams,
    write_new_file,
    write_new_files,
)
from seqvae.store.files import CURVES, METRICS, PER_TEXT, PREDICTIONS


def write_test_results(trainer, model, datamodule, seed_everything, command_line: list[str], extra: dict) -> None:
    """After a test: metrics.json (the test/ metrics, `extra`, data summary, seeds, the run's
    flags and provenance) and per_text.csv, numbered together; the HPARAMS records; the test
    metrics printed; the per-text values from the trainer's `PerTextRows`. Rank 0 only (under
    DDP every rank has the same reduced metrics)."""
    log_dir = trainer.log_dir  # a broadcast under DDP: on every rank
    if not trainer.is_global_zero:
        return
    if log_dir is None:  # fast_dev_run: Lightning's stand-in logger has no directory
        print(f"seqvae: no run directory (trainer.fast_dev_run); {METRICS} not written", file=sys.stderr)
        return
    run_dir = Path(log_dir)
    m = model
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(TEST)}
    unknown = undeclared(metrics)  # kept all the same: a computed number is never dropped
    if unknown:
        print(
            f"seqvae: warning: {', '.join(unknown)} not declared in seqvae/metric_spec.py: in {METRICS}, but compare, "
            "its plots and TensorBoard's HPARAMS do not show them",
            file=sys.stderr,
        )
    metrics.update({"best_updates": m.num_updates, "iw_samples": m.hparams.test_iw_samples, **extra})
    metrics["data"] = datamodule.summary()
    metrics["test_texts_sha256"] = metrics["data"]["test"]["sha256"]
    metrics["seeds"] = {
        "seed_everything": seed_everything,
        "data.seed": datamodule.hparams.seed,
        "aggressive.seed": m.aggressive.seed if m.aggressive is not None else None,
        "eval_seed": m.hparams.eval_seed,
    }
    metrics.update(m.run_flags())  # warnings about this run's numbers (e.g. BN-VAE's bound), for compare
    metrics["provenance"] = provenance(["seqvae", *command_line])
    rows = next((cb.rows for cb in trainer.callbacks if isinstance(cb, PerTextRows)), None)
    files, test = {}, datamodule.corpora["test"]
    in_file = (metrics["data"].get("test") or {}).get("texts")
    if rows is not None and in_file is not None:
        metrics.update(texts_tested(len(rows["index"]), in_file, trainer.limit_test_batches))
    # metrics.json marks a complete set: a per_text.csv without its metrics.json (a kill
    # between the two writes) is the unfinished half of this set and is replaced.
    n = free_number([run_dir / METRICS])
    if rows is not None and len(rows["index"]):
        metrics["per_text_file"] = numbered(run_dir / PER_TEXT, n).name
        files[run_dir / PER_TEXT] = per_text_csv(rows, test.line_numbers, test.labels)
    files[run_dir / METRICS] = json.dumps(metrics, indent=2, sort_keys=True) + "\n"
    path = write_new_files(files, n)[run_dir / METRICS]
    log_hparams(trainer.logger, run_hparams(m, seed_everything), metrics)
    width = max(len(k) for k in metrics)
    print(f"seqvae: wrote {path}")
    for k, v in sorted(metrics.items()):
        if k.startswith(TEST):
            print(f"  {k:<{width}}  {v:.4f}")


def texts_tested(tested: int, in_file: int, limit) -> dict:
    """The count of texts the test/ metrics are means over; fewer than the test file holds
    (`trainer.limit_test_batches`) is a check record that says broken, so compare marks every metric
    of the run (`analysis/runs.py`) and nobody reads a partial test as a full one."""
    out: dict = {"tested_texts": tested}
    if tested < in_file:
        out["partial_test"] = {
            "broken": True,
            "marks": "all",
            "texts": tested,
            "of": in_file,
            "limit_test_batches": limit,
            "title": f"tested on {tested} of the test file's {in_file} texts",
            "consequence": "every test/ metric is a mean over those texts only (trainer.limit_test_batches), not a full test",
        }
        print(
            f"seqvae: warning: {out['partial_test']['title']} (trainer.limit_test_batches {limit}): a partial test",
            file=sys.stderr,
        )
    return out


def fit_totals(trainer, model) -> dict:
    """What metrics.json says of the training after `fit` (taken before the test of the best
    checkpoint puts that checkpoint's counts into the model)."""
    return {
        "updates": model.num_updates,
        "encoder_updates": model.encoder_updates,
        "decoder_updates": model.decoder_updates,
        "fit_seconds": round(model.fit_seconds, 1),
        "epochs": trainer.current_epoch,
        "best_checkpoint": trainer.checkpoint_callback.best_model_path or None,
    }


def write_fit_curves(trainer) -> None:
    """After `fit`: curves.csv, the validation curves from the event files (`seqvae compare --plots`)."""
    log_dir = trainer.log_dir
    if trainer.is_global_zero and log_dir is not None:
        from seqvae.rundir.curves import write_curves

        write_curves(Path(log_dir), Path(log_dir) / CURVES)


def write_predictions(trainer, generation, lines: list[str], n_texts: int, blank: str = "") -> None:
    """After `predict`: the generated texts (`model.generation`; `lines`, one per line, `n_texts`
    of them generated, `blank` what the message says of empty lines) in predictions.txt (never
    overwriting: predictions-2.txt, …), and on stdout if asked."""
    text = "".join(line + "\n" for line in lines)
    if generation.stdout:
        sys.stdout.write(text)
    if trainer.log_dir is None:  # fast_dev_run
        print(f"seqvae: no run directory (trainer.fast_dev_run); {len(lines)} texts not written", file=sys.stderr)
        return
    path = write_new_file(Path(trainer.log_dir) / PREDICTIONS, text)
    drop_empty_event_files(Path(trainer.log_dir))
    decoding = generation.resolved().decoding
    print(f"seqvae: wrote {n_texts} texts ({generation.mode}, {decoding}) to {path}{blank}", file=sys.stderr)
