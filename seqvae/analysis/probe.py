"""`seqvae probe RUN_OR_CKPT`: what z knows about a text's label. The posterior means mu(x) (the
encoder's mean, evaluation mode, no sampling) of a labelled training pool and of a held-out
labelled split; a multinomial logistic-regression probe trained on n labelled texts (several
random draws of them per n) and scored on the held-out split: mean accuracy with a 95% Student-t
interval over the draws, beside the held-out split's majority-class rate (docs/probe.md).

    seqvae probe RUN_DIR [--train FILE#FIRST-LAST] [--test FILE#FIRST-LAST] [--sizes 100,500,1000,2000]
                 [--draws 5] [--seed 0] [--label-column first_token|tab] [--force]

Writes probe.json into the run directory and adds `probe/acc_n<N>` and `probe/majority` to its
metrics.json (for `seqvae compare`). Torch is imported inside `main` only: `--help` is instant.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from seqvae.analysis.differences import t975
from seqvae.errors import ConfigError, CorpusError
from seqvae.store.files import BEST_CKPT, CHECKPOINTS, METRICS, atomic_write_text
from seqvae.text.splits import parse_split, resolve_splits, split_value

PROBE = "probe.json"
PREFIX = "probe/"
SIZES = "100,500,1000,2000"
C = 1.0  # inverse L2 strength, scikit-learn's default: minimise sum of cross-entropies + ||W||^2 / (2C)
MAX_ITER = 500


class ProbeError(ValueError):
    """Bad input to the probe; printed as one line, rc 2."""


# ---------------------------------------------------------------- the probe itself (tensors in, numbers out)


def fit_probe(x, y, n_classes: int, c: float = C, max_iter: int = MAX_ITER) -> dict:
    """Multinomial logistic regression on standardised x (N, D) -> labels y (N,) in [0, n_classes):
    full-batch L-BFGS (strong Wolfe line search) in float64 from zero weights, minimising
    mean cross-entropy + ||W||^2 / (2 C N) (the bias is not penalised). Deterministic."""
    import torch

    x = x.detach().to(torch.float64)
    mean, std = x.mean(0), x.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))  # a constant dimension carries nothing
    z = (x - mean) / std
    y = y.detach().to(torch.long)
    w = torch.zeros(z.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    penalty = 1.0 / (2.0 * c * len(y))

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ w + b, y) + penalty * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return {"w": w.detach(), "b": b.detach(), "mean": mean, "std": std}


def predict(probe: dict, x):
    import torch

    z = (x.detach().to(torch.float64) - probe["mean"]) / probe["std"]
    return (z @ probe["w"] + probe["b"]).argmax(1)


def interval(values: list[float]) -> dict:
    """Mean with its 95% Student-t interval over the accuracies (no bounds for fewer than 2),
    cut to [0, 1]: with few draws the t-interval reaches past what an accuracy can be
    (`[0.033, 1.127]` for two draws)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "lo": None, "hi": None, "sd": None}
    sd = statistics.stdev(values)
    half = t975(len(values) - 1) * sd / math.sqrt(len(values))
    return {"mean": mean, "lo": max(0.0, mean - half), "hi": min(1.0, mean + half), "sd": sd}


def majority_rate(y) -> tuple[int, float]:
    """The most frequent label of y and its share (ties: the smallest label)."""
    counts = Counter(int(v) for v in y)
    label = min(counts, key=lambda k: (-counts[k], k))
    return label, counts[label] / len(y)


def probe_accuracies(
    train_x, train_y, test_x, test_y, sizes: list[int], draws: int, seed: int, n_classes: int | None = None
) -> dict:
    """For each n: `draws` random subsets of n training texts (seeded by seed, n and the draw, so a
    size's subsets do not depend on the other sizes), a probe fitted on each, its accuracy on the
    test texts; their mean with a 95% t-interval, and the test split's majority-class rate."""
    n_classes = n_classes or int(max(int(train_y.max()), int(test_y.max()))) + 1
    out = {}
    for n in sizes:
        if n > len(train_y):
            raise ProbeError(f"--sizes: {n} labelled texts asked for but the training pool holds {len(train_y)}")
        accs = []
        for d in range(draws):
            pick = sorted(random.Random(f"{seed}:{n}:{d}").sample(range(len(train_y)), n))
            probe = fit_probe(train_x[pick], train_y[pick], n_classes)
            accs.append(float((predict(probe, test_x) == test_y).double().mean()))
        out[n] = {"n": n, "draws": draws, "accuracies": accs, **interval(accs)}
    label, rate = majority_rate(test_y)
    return {"sizes": out, "majority": rate, "majority_class": label}


# ---------------------------------------------------------------- a run's model and labelled splits


def locate(target: Path) -> tuple[Path, Path, bool]:
    """(checkpoint, run directory, whether metrics.json describes this checkpoint: the run's best)."""
    if target.is_dir():
        ckpt = target / CHECKPOINTS / BEST_CKPT
        if not ckpt.is_file():
            raise ProbeError(f"RUN_OR_CKPT: {target}: not a run directory (no {CHECKPOINTS}/{BEST_CKPT})")
        return ckpt, target, True
    if not target.is_file():
        raise ProbeError(f"RUN_OR_CKPT: {target}: no such run directory or checkpoint file")
    run = target.parent.parent if target.parent.name == CHECKPOINTS else target.parent
    return target, run, target.parent.name == CHECKPOINTS and target.name == BEST_CKPT


def load_model(ckpt: Path):
    """The SeqVAE of a checkpoint, read with the one checkpoint loader (weights_only), in eval mode."""
    from pytorch_lightning.core.saving import _load_state

    from seqvae.core.model import SeqVAE
    from seqvae.store.checkpoints import load_checkpoint, require_run_checkpoint

    checkpoint = require_run_checkpoint(load_checkpoint(ckpt, "RUN_OR_CKPT"), ckpt, "RUN_OR_CKPT")
    if "vocab" not in checkpoint:
        raise ProbeError(f"RUN_OR_CKPT: {ckpt}: the checkpoint holds no vocabulary (written before seqvae saved one)")
    model = _load_state(SeqVAE, checkpoint, strict=True)
    return model.eval(), checkpoint.get("datamodule_hyper_parameters") or {}


def read_labelled(spec: str, option: str, label_column, max_length):
    """A split's texts and labels; refused in one line if it holds no labelled text."""
    from seqvae.text.corpus import read_corpus

    try:
        path, lines = parse_split(spec)
        corpus = read_corpus(path, lines, label_column, max_length)
    except (CorpusError, ConfigError) as err:
        raise ProbeError(f"{option}: {err}") from None
    kept = [(t, lab) for t, lab in zip(corpus.texts, corpus.labels) if lab is not None]
    if not kept:
        raise ProbeError(f"{option}: {spec}: no labelled text (data.label_column {label_column}: no line carries a label)")
    return [t for t, _ in kept], [lab for _, lab in kept], len(corpus.texts) - len(kept)


def overlap(a: str, b: str) -> str | None:
    (fa, la), (fb, lb) = parse_split(a), parse_split(b)
    if Path(fa).resolve() != Path(fb).resolve():
        return None
    if la is None or lb is None:
        return "the whole file"
    lo, hi = max(la[0], lb[0]), min(la[1], lb[1])
    return f"lines {lo}-{hi}" if lo <= hi else None


def posterior_means(model, texts: list[list[str]], batch_size: int = 64):
    """mu(x) (N, Z) in input order; encoded in length order (less padding), eval mode, no sampling."""
    import torch

    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    mu, _ = model.encode([" ".join(texts[i]) for i in order], batch_size)
    out = torch.empty_like(mu)
    out[torch.tensor(order)] = mu
    return out


def class_index(labels: list[str]) -> list[str]:
    """The classes, sorted as numbers where all are integers (`0`..`4`), else as text."""
    distinct = set(labels)
    try:
        return sorted(distinct, key=int)
    except ValueError:
        return sorted(distinct)


# ---------------------------------------------------------------- the command


def run_probe(args) -> dict:
    import torch

    ckpt, run, describes_metrics = locate(args.target)
    sizes = parse_sizes(args.sizes)
    held = run / PROBE
    metrics_path = run / METRICS
    metrics = read_metrics(metrics_path) if describes_metrics and metrics_path.is_file() else None
    if not args.force:
        if held.exists():
            raise ProbeError(f"{held}: exists (a probe already run): give --force to replace it")
        if metrics is not None and any(k.startswith(PREFIX) for k in metrics):
            raise ProbeError(f"{metrics_path}: already holds probe/ keys: give --force to replace them")
    torch.set_num_threads(min(torch.get_num_threads(), args.threads))  # never more than torch found
    start = time.monotonic()
    model, data = load_model(ckpt)
    if model.encoder is None:
        raise ProbeError(f"RUN_OR_CKPT: {ckpt}: a language model (latent_dim 0) has no z to probe")
    reading = model.vocab.reading or {}
    label_column = args.label_column or reading.get("label_column") or data.get("label_column") or False
    if label_column in (False, "false", None):
        raise ProbeError(
            f"--label-column: {ckpt} was trained reading no labels (data.label_column false): "
            "give --label-column first_token or tab"
        )
    splits = {}
    if data.get("train") or data.get("train_lines"):
        keys = ("train", "val", "test", "train_lines", "val_lines", "test_lines")
        try:
            splits = resolve_splits(*(data.get(k) for k in keys))
        except (CorpusError, ConfigError) as err:
            raise ProbeError(f"RUN_OR_CKPT: {ckpt}: its data splits: {err}") from None
    specs = {}
    for name in ("train", "test"):
        given = getattr(args, name)
        if given is None and splits.get(name) is None:
            raise ProbeError(f"--{name}: {ckpt} records no {name} split: give --{name} FILE#FIRST-LAST")
        specs[name] = given if given is not None else split_value(*splits[name])
    shared = overlap(specs["train"], specs["test"])
    if shared:
        raise ProbeError(
            f"--test: {specs['test']} shares {shared} with --train {specs['train']}: the held-out split must be held out"
        )
    max_length = data.get("max_length")
    train_texts, train_labels, train_unlabelled = read_labelled(specs["train"], "--train", label_column, max_length)
    test_texts, test_labels, test_unlabelled = read_labelled(specs["test"], "--test", label_column, max_length)
    if too_many := [n for n in sizes if n > len(train_texts)]:  # all of them at once, not one refusal per retry
        raise ProbeError(
            f"--sizes: {', '.join(map(str, too_many))} labelled texts asked for but --train {specs['train']} holds "
            f"{len(train_texts)}"
            + (f" (the default sizes: give --sizes up to {len(train_texts)})" if args.sizes == SIZES else "")
        )
    classes = class_index(train_labels + test_labels)
    index = {c: i for i, c in enumerate(classes)}
    train_y = torch.tensor([index[v] for v in train_labels])
    test_y = torch.tensor([index[v] for v in test_labels])
    train_x, test_x = posterior_means(model, train_texts), posterior_means(model, test_texts)
    result = probe_accuracies(train_x, train_y, test_x, test_y, sizes, args.draws, args.seed, len(classes))
    return {
        "checkpoint": str(ckpt),
        "run_dir": str(run),
        "label_column": label_column,
        "train": {"split": specs["train"], "texts": len(train_texts), "unlabelled_skipped": train_unlabelled},
        "test": {
            "split": specs["test"],
            "texts": len(test_texts),
            "unlabelled_skipped": test_unlabelled,
            "class_counts": {classes[k]: v for k, v in sorted(Counter(test_y.tolist()).items())},
        },
        "classes": classes,
        "latent_dim": int(train_x.shape[1]),
        "mu_std": float(test_x.std(0).mean()),  # how much the raw means vary across held-out texts
        "probe": {
            "model": "multinomial logistic regression on standardised posterior means",
            "optimiser": "full-batch L-BFGS (strong Wolfe), float64, zero init",
            "C": C,
            "max_iter": MAX_ITER,
        },
        "seed": args.seed,
        "draws": args.draws,
        "sizes": {str(n): r for n, r in result["sizes"].items()},
        "majority": result["majority"],
        "majority_class": classes[result["majority_class"]],
        "seconds": round(time.monotonic() - start, 1),
        "command": "seqvae probe " + " ".join(args.argv),
        "_metrics": metrics if metrics is not None else None,
        "_metrics_path": str(metrics_path) if metrics is not None else None,
    }


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ProbeError(f"--sizes: {text!r}: expected comma-separated counts, e.g. 100,500,1000,2000") from None
    if not sizes or min(sizes) < 2:
        raise ProbeError(f"--sizes: {text!r}: each size must be at least 2")
    return sizes


def read_metrics(path: Path) -> dict:
    try:
        metrics = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ProbeError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(metrics, dict):
        raise ProbeError(f"{path}: does not hold a mapping")
    return metrics


def probe_metrics(result: dict) -> dict:
    """The flat keys metrics.json gets: probe/acc_n<N> (mean accuracy over draws) and probe/majority."""
    keys = {f"{PREFIX}acc_n{n}": r["mean"] for n, r in result["sizes"].items()}
    return {**keys, f"{PREFIX}majority": result["majority"]}


def write_results(result: dict) -> list[Path]:
    """probe.json, then the run's metrics.json with its probe/ keys replaced (every other key kept);
    each written atomically (temporary file, os.replace)."""
    metrics, metrics_path = result.pop("_metrics"), result.pop("_metrics_path")
    run = Path(result["run_dir"])
    atomic_write_text(run / PROBE, json.dumps(result, indent=2) + "\n")
    written = [run / PROBE]
    if metrics is not None:
        kept = {k: v for k, v in metrics.items() if not k.startswith(PREFIX)}
        atomic_write_text(metrics_path, json.dumps({**kept, **probe_metrics(result)}, indent=2, sort_keys=True) + "\n")
        written.append(Path(metrics_path))
    return written


def table(result: dict) -> str:
    lines = [
        f"seqvae probe: {result['checkpoint']}: z {result['latent_dim']}, "
        f"posterior means of {result['train']['texts']} "
        f"labelled training texts ({result['train']['split']}) and "
        f"{result['test']['texts']} held-out ({result['test']['split']}), "
        f"{len(result['classes'])} classes, {result['draws']} draws per n (seed {result['seed']})",
        f"{'n':>6}  {'accuracy':>8}  95% interval",
    ]
    for n, r in result["sizes"].items():
        bounds = f"[{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else "(one draw: none)"
        lines.append(f"{n:>6}  {r['mean']:8.3f}  {bounds}")
    lines.append(f"majority class of the held-out split: {result['majority']:.3f} (label {result['majority_class']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="seqvae probe", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("target", type=Path, metavar="RUN_OR_CKPT", help="a run directory (checkpoints/best.ckpt) or a checkpoint")
    p.add_argument("--train", help="the labelled pool the probe draws from, FILE#FIRST-LAST (default: the run's train split)")
    p.add_argument("--test", help="the held-out labelled split, FILE#FIRST-LAST (default: the run's test split)")
    p.add_argument("--sizes", default=SIZES, help=f"labelled training texts per probe, comma-separated (default {SIZES})")
    p.add_argument("--draws", type=int, default=5, help="random subsets per size (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the subsets (default 0)")
    p.add_argument("--label-column", choices=["first_token", "tab"], help="label format (default: the checkpoint's)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--force", action="store_true", help="replace an earlier probe.json and metrics.json's probe/ keys")
    args = p.parse_args(argv)
    args.argv = argv
    for name in ("draws", "threads"):  # --threads 0 was silently taken as 1
        if getattr(args, name) < 1:
            p.error(f"--{name}: must be >= 1, got {getattr(args, name)}")
    try:
        result = run_probe(args)
    except (ProbeError, CorpusError, ConfigError) as err:
        print(f"seqvae probe: error: {err}", file=sys.stderr)
        return 2
    text = table(result)
    written = write_results(result)
    print(text)
    print(f"wrote {', '.join(map(str, written))}")
    if len(written) == 1:
        print(
            f"seqvae probe: {result['checkpoint']} is not a run's best checkpoint with a metrics.json: metrics.json left alone",
            file=sys.stderr,
        )
    return 0
