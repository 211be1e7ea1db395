#!/usr/bin/env python
"""Run He et al.'s reference implementation (github.com/jxhe/vae-lagging-encoder, MIT) on
yahoo10k with its own training script, and compare its test numbers with seqvae's.

Nothing of the reference's code is kept in this repository: ``yahoo10k`` copies a clean clone
(``--he``) into a work directory outside the repository, applies the few documented text
substitutions listed in ``work_copy.HE_PATCHES`` (each must match its stated number of times, or it stops), writes
a config module ``config/config_yahoo10k.py`` there, writes the yahoo10k split files in the
format the reference's loader reads (one whitespace-tokenised text per line, words outside
seqvae's 5,000-word training vocabulary already replaced by ``_UNK``), and runs the reference's
``text.py`` (training, plateau rule, final test with calc_iwnll / calc_mi / calc_au on the best
checkpoint) in a child process with one thread.  When it ends it writes ``metrics.json`` (and
``per_text.csv``: per-text IW-NLL, observed, not changed, by wrapping ``VAE.nll_iw``) into
``--out``.

    python -m tools.reference yahoo10k --he /work/ref/he_clean --seed 1 --he-commit <sha>
        --out docs/results/reference_yahoo10k/he/seed1
    python -m tools.reference compare
        --ref docs/results/reference_yahoo10k/he --seqvae docs/results/yahoo10k_recipe20/last
    python -m tools.reference collect --out <run dir>    # metrics.json again from its log
    python -m tools.reference eval --out <run dir>       # re-test its best checkpoint
                                                                # with text.py --eval

``compare`` gives, per metric, the unpaired difference reference - seqvae of the seed means
with a Welch 95% interval (Welch-Satterthwaite degrees of freedom, Student-t quantile computed
here from the regularised incomplete beta function: standard library + numpy only).
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tools.reference.work_copy import HE_PATCHES, clone_commit, prepare_work

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SOURCE = REPO / ".." / "shared" / "data" / "yahoo" / "valid.txt"
SPLITS = {"train": (1, 8000), "valid": (8001, 9000), "test": (9001, 10000)}  # 1-based, inclusive
UNK = "_UNK"
MAX_VOCAB = 5000
SEQVAE_SPECIALS = ("<pad>", "<s>", "</s>", UNK)

# Child process: one thread, observe VAE.nll_iw (per-text IW-NLL), then run text.py as __main__.
CHILD = r"""
import json, os, runpy, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, os.getcwd())
import modules.vae as _vae
_orig = _vae.VAE.nll_iw
_rec = []
_t = {}
def _nll_iw(self, x, nsamples, ns=100):
    if not _rec:
        _t["first_iw"] = time.time()
    out = _orig(self, x, nsamples, ns)
    _rec.append([x[0].tolist(), [float(v) for v in out.reshape(-1).tolist()]])
    return out
_vae.VAE.nll_iw = _nll_iw
print("[reference_check] torch %s, threads %d" % (torch.__version__, torch.get_num_threads()))
sys.stdout.flush()
sys.argv = ["text.py"] + json.loads(os.environ["REFCHECK_ARGV"])
try:
    runpy.run_path("text.py", run_name="__main__")
finally:
    with open(os.environ["REFCHECK_IW_DUMP"], "w") as f:
        json.dump({"times": _t, "records": _rec}, f)
"""


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_lines(path: Path) -> list[list[str]]:
    """Lines split on \\n only (like seqvae's read_corpus), tokens split on whitespace."""
    raw = path.read_bytes().decode("utf-8")
    pieces = raw.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    return [p.rstrip("\r").split() for p in pieces]


def build_vocab(train: list[list[str]]) -> set[str]:
    """seqvae's Vocabulary.build with max_vocab=5000, min_freq=1: most frequent first, ties
    alphabetically, the 4 reserved tokens (pad, <s>, </s>, _UNK) not counted."""
    counts = Counter(t for text in train for t in text)
    for s in SEQVAE_SPECIALS:
        counts.pop(s, None)
    words = sorted(counts, key=lambda w: (-counts[w], w))[:MAX_VOCAB]
    return set(words)


def write_splits(source: Path, data_dir: Path, limit: int | None) -> dict:
    lines = read_lines(source)
    splits = {k: lines[a - 1 : b] for k, (a, b) in SPLITS.items()}
    if any(len(t) == 0 for s in splits.values() for t in s):
        raise SystemExit("empty line in a split: seqvae skips it, the reference drops it; check")
    vocab = build_vocab(splits["train"])  # from the full 8,000 training texts, as seqvae
    data_dir.mkdir(parents=True, exist_ok=True)
    stats = {"source": str(source.resolve()), "source_sha256": sha256_file(source), "vocab_words": len(vocab)}
    for name, texts in splits.items():
        if limit:
            texts = texts[:limit]
        out, n_unk, n_tok = [], 0, 0
        for t in texts:
            mapped = [w if w in vocab else UNK for w in t]
            n_unk += sum(w == UNK for w in mapped)
            n_tok += len(mapped)
            out.append(" ".join(mapped))
        p = data_dir / f"{name}.txt"
        content = "\n".join(out) + "\n"
        if not p.exists() or p.read_text() != content:  # atomic: concurrent seeds share the files
            tmp = p.with_name(f".{p.name}.{os.getpid()}")
            tmp.write_text(content)
            os.replace(tmp, p)
        stats[name] = {"file": str(p), "lines": f"{SPLITS[name][0]}-{SPLITS[name][0] + len(texts) - 1}",
                       "texts": len(texts), "tokens": n_tok, "unk_rate": n_unk / n_tok, "sha256": sha256_file(p)}
    return stats


def config_module(data_dir: Path, epochs: int) -> tuple[str, dict]:
    params = {
        "enc_type": "lstm",
        "dec_type": "lstm",
        "nz": 32,
        "ni": 64,
        "enc_nh": 128,
        "dec_nh": 128,
        "dec_dropout_in": 0.5,
        "dec_dropout_out": 0.5,
        "batch_size": 32,
        "epochs": epochs,
        "test_nepoch": 5,
        "train_data": str(data_dir / "train.txt"),
        "val_data": str(data_dir / "valid.txt"),
        "test_data": str(data_dir / "test.txt"),
    }
    src = "# written by seqvae tools/reference/check.py (yahoo10k, seqvae's 20-epoch recipe)\n"
    src += "params = " + json.dumps(params, indent=4) + "\n"
    return src, params


FLOAT = r"(-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)"
EVAL_RE = re.compile(
    r"(VAL|TEST) --- avg_loss: %s, kl: %s, mi: %s, recon: %s, nll: %s, ppl: %s" % ((FLOAT,) * 6))
AU_RE = re.compile(r"^(\d+) active units")
IW_RE = re.compile(r"iw nll: %s, iw ppl: %s" % (FLOAT, FLOAT))


def run_yahoo10k(a) -> int:
    t_start = time.time()
    he = Path(a.he).resolve()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or f"/work/ref/work/seed{a.seed}").resolve()
    data_dir = Path(a.data_dir).resolve()
    commit = a.he_commit or clone_commit(he)
    stats = write_splits(Path(a.source), data_dir, a.limit_lines)
    patches = prepare_work(he, work, HE_PATCHES)
    src, params = config_module(data_dir, a.epochs)
    (work / "config" / "config_yahoo10k.py").write_text(src)
    taskid = a.seed - 1
    seed_set = [783435, 101, 202, 303, 404, 505, 606, 707, 808, 909]  # text.py's own list
    argv = ["--dataset", "yahoo10k", "--taskid", str(taskid), "--kl_start", "0.1", "--warm_up", "10",
            "--iw_nsamples", str(a.iw_samples), "--nsamples", "1", "--aggressive", "0"]
    log = Path(a.log or f"/tmp/reference_yahoo10k_seed{a.seed}.log")
    iw_dump = work / "iw_records.json"
    config = {
        "reference": {"repo": "https://github.com/jxhe/vae-lagging-encoder", "commit": commit,
                      "clone": str(he), "work_dir": str(work), "script": "text.py", "argv": argv},
        "command": "python " + " ".join(sys.argv),
        "seed": {"requested": a.seed, "text.py --taskid": taskid, "torch/numpy seed": seed_set[taskid]},
        "params (config/config_yahoo10k.py)": params,
        "text.py constants (unchanged)": {"clip_grad": 5.0, "decay_epoch": 2, "lr_decay": 0.5, "max_decay": 5,
                                          "lr": 1.0, "momentum": 0, "plateau min epoch index": 15},
        "patches": patches,
        "data": stats,
        "threads": {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1, "torch.set_num_threads": 1},
        "log": str(log),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               REFCHECK_ARGV=json.dumps(argv), REFCHECK_IW_DUMP=str(iw_dump), PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    rc = run_child(work, env, log)
    shutil.copy(log, out / "train.log")
    metrics = build_metrics(parse_log(log.read_text()), rc, a.iw_samples)
    add_per_text(metrics, iw_dump, work, data_dir, out)
    metrics["wall_seconds"] = round(time.time() - t_start, 1)
    return write_metrics(metrics, out)


def run_child(work: Path, env: dict, log: Path, mode: str = "w") -> int:
    """Run CHILD in `work`, copying its output to `log` with a timestamped line per validation."""
    t_child = time.time()
    epochs = 0
    with open(log, mode) as logf:
        proc = subprocess.Popen([sys.executable, "-u", "-c", CHILD], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        logf.write(f"[reference_check] pid {proc.pid} started {time.strftime('%H:%M:%S')}\n")
        for line in proc.stdout:
            logf.write(line)
            m = EVAL_RE.search(line)
            if m and m.group(1) == "VAL":
                epochs += 1
                logf.write(f"[reference_check] epoch {epochs} done at {time.strftime('%H:%M:%S')} "
                           f"({time.time() - t_child:.0f}s) val loss {float(m.group(2)):.3f} "
                           f"kl {float(m.group(3)):.4f} mi {float(m.group(4)):.4f}\n")
            logf.flush()
        rc = proc.wait()
        logf.write(f"[reference_check] exit {rc} at {time.strftime('%H:%M:%S')}\n")
    return rc


EPOCH_RE = re.compile(r"^\[reference_check\] epoch (\d+) done at \S+ \((\d+)s\)")


def parse_log(text: str) -> dict:
    """VAL / TEST lines, AU lines (one after each), the IW line, lr decays, epoch times."""
    vals, tests, iw, decays, fit = [], [], None, 0, None
    last_eval = None
    for line in text.splitlines():
        m = EVAL_RE.search(line)
        if m:
            rec = dict(zip(["loss", "kl", "mi", "rec", "nll", "ppl"], [float(v) for v in m.groups()[1:]]))
            (vals if m.group(1) == "VAL" else tests).append(rec)
            last_eval = m.group(1)
        m = AU_RE.search(line)
        if m and last_eval:
            (vals if last_eval == "VAL" else tests)[-1]["au"] = int(m.group(1))
        m = IW_RE.search(line)
        if m:
            iw = (float(m.group(1)), float(m.group(2)))
        if line.startswith("new lr"):
            decays += 1
        m = EPOCH_RE.search(line)
        if m:
            fit = int(m.group(2))
    return {"vals": vals, "tests": tests, "iw": iw, "decays": decays, "fit_seconds": fit}


def build_metrics(p: dict, rc: int | None, iw_samples: int) -> dict:
    vals, tests, iw = p["vals"], p["tests"], p["iw"]
    ok = (rc in (0, None)) and iw is not None and tests and "au" in tests[-1]
    metrics = {"status": "ok" if ok else f"failed (exit {rc})", "exit_code": rc}
    if vals:
        best = min(vals, key=lambda r: r["loss"])
        metrics.update({"epochs": len(vals), "val/best_loss": best["loss"],
                        "val/best_epoch": vals.index(best) + 1,
                        "val/loss_per_epoch": [r["loss"] for r in vals], "val/kl_per_epoch": [r["kl"] for r in vals],
                        "val/mi_per_epoch": [r["mi"] for r in vals], "val/au_per_epoch": [r.get("au") for r in vals],
                        "lr_decays": p["decays"], "fit_seconds": p["fit_seconds"]})
    if ok:
        t = tests[-1]  # the last TEST line: text.py's final test() on the best checkpoint
        metrics.update({
            "test/iw_nll": iw[0], "test/iw_ppl": iw[1], "iw_samples": iw_samples,
            "test/kl": t["kl"], "test/mi": t["mi"], "test/rec": t["rec"], "test/elbo": t["loss"],
            "test/elbo_ppl": t["ppl"], "test/au": t["au"],
        })
    return metrics


def add_per_text(metrics: dict, iw_dump: Path, work: Path, data_dir: Path, out: Path) -> None:
    if not iw_dump.exists():
        return
    d = json.loads(iw_dump.read_text())
    recs = d["records"]
    if recs:
        metrics["eval_seconds_iw"] = round(iw_dump.stat().st_mtime - d["times"]["first_iw"], 1)
    per_text = map_per_text(recs, work, data_dir)
    if per_text:
        vals_ = [v for _, v in per_text]
        metrics["test/iw_nll_full_precision"] = sum(vals_) / len(vals_)
        metrics["test/iw_texts"] = len(vals_)
        with open(out / "per_text.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["index", "iw_nll"])
            for i, v in per_text:
                w.writerow([i, repr(v)])
        metrics["per_text_file"] = "per_text.csv"


def write_metrics(metrics: dict, out: Path) -> int:
    metrics["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps({k: v for k, v in metrics.items() if not k.endswith("per_epoch")}, indent=1))
    return 0 if metrics["status"] == "ok" else 1


def run_collect(a) -> int:
    """Rebuild metrics.json of a run from its log (e.g. the runner was killed after its child)."""
    out = Path(a.out)
    cfg = json.loads((out / "config.json").read_text())
    work, log = Path(cfg["reference"]["work_dir"]), Path(cfg["log"])
    data_dir = Path(cfg["data"]["train"]["file"]).parent
    iw_samples = int(cfg["reference"]["argv"][cfg["reference"]["argv"].index("--iw_nsamples") + 1])
    shutil.copy(log, out / "train.log")
    metrics = build_metrics(parse_log(log.read_text()), None, iw_samples)
    metrics["collected_from_log"] = True
    add_per_text(metrics, work / "iw_records.json", work, data_dir, out)
    return write_metrics(metrics, out)


def run_eval(a) -> int:
    """Test the saved best checkpoint again with text.py's own --eval mode (test(), calc_au,
    calc_iwnll), e.g. when the training finished but the runner was stopped during the test.
    Training numbers (val, epochs, decays, fit time) come from the training log."""
    t_start = time.time()
    out = Path(a.out)
    cfg = json.loads((out / "config.json").read_text())
    work, log = Path(cfg["reference"]["work_dir"]), Path(cfg["log"])
    data_dir = Path(cfg["data"]["train"]["file"]).parent
    argv = list(cfg["reference"]["argv"])
    iw_samples = int(argv[argv.index("--iw_nsamples") + 1])
    ckpts = sorted((work / "models" / "yahoo10k").glob("*.pt"))
    if len(ckpts) != 1:
        raise SystemExit(f"expected one checkpoint under {work}/models/yahoo10k, found {ckpts}")
    argv += ["--eval", "--load_path", str(ckpts[0])]
    eval_log = Path(str(log) + ".eval")
    iw_dump = work / "iw_records_eval.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               REFCHECK_ARGV=json.dumps(argv), REFCHECK_IW_DUMP=str(iw_dump), PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    rc = run_child(work, env, eval_log)
    train = parse_log(log.read_text())
    test = parse_log(eval_log.read_text())
    p = dict(train, tests=test["tests"], iw=test["iw"])
    metrics = build_metrics(p, rc, iw_samples)
    metrics["test_from"] = f"text.py --eval --load_path {ckpts[0]} (separate process; command: python {' '.join(sys.argv)})"
    shutil.copy(log, out / "train.log")
    shutil.copy(eval_log, out / "eval.log")
    add_per_text(metrics, iw_dump, work, data_dir, out)
    metrics["eval_wall_seconds"] = round(time.time() - t_start, 1)
    return write_metrics(metrics, out)


def map_per_text(recs, work: Path, data_dir: Path):
    """Map each IW record (ids of one batch-of-1 test text, with <s> and </s>) back to the
    0-based index of that text in test.txt, rebuilding the reference's vocabulary the way its
    MonoTextData does (ids in order of first appearance in train.txt after the 4 specials)."""
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for line in (data_dir / "train.txt").read_text().splitlines():
        for w in line.split():
            vocab.setdefault(w, len(vocab))
    index = {}
    for i, line in enumerate((data_dir / "test.txt").read_text().splitlines()):
        key = tuple([1] + [vocab.get(w, 3) for w in line.split()] + [2])
        index.setdefault(key, []).append(i)
    out = []
    for ids, vals in recs:
        if len(vals) != 1:
            return None
        slot = index.get(tuple(ids))
        if not slot:
            return None
        out.append((slot.pop(0), vals[0]))
    out.sort()
    return out


# ---------------------------------------------------------------- Welch comparison


def betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(lbt) * betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2, 0.5, x)
    return 1 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    lo, hi = 0.0, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def welch(x: list[float], y: list[float], level: float = 0.95) -> dict:
    """Difference mean(x) - mean(y), unpaired, Welch-Satterthwaite df, Student-t interval."""
    import numpy as np

    x, y = np.asarray(x, float), np.asarray(y, float)
    nx, ny = len(x), len(y)
    vx, vy = x.var(ddof=1), y.var(ddof=1)
    d = float(x.mean() - y.mean())
    se2 = vx / nx + vy / ny
    res = {"diff": d, "n_ref": nx, "n_seqvae": ny, "mean_ref": float(x.mean()), "mean_seqvae": float(y.mean()),
           "sd_ref": float(math.sqrt(vx)), "sd_seqvae": float(math.sqrt(vy))}
    if se2 == 0:
        res.update({"se": 0.0, "df": None, "t": None, "lo": d, "hi": d,
                    "note": "no variance on either side: the interval is the point"})
        return res
    df = se2**2 / ((vx / nx) ** 2 / (nx - 1) + (vy / ny) ** 2 / (ny - 1))
    tq = t_quantile(0.5 + level / 2, df)
    se = math.sqrt(se2)
    res.update({"se": se, "df": float(df), "t": tq, "lo": d - tq * se, "hi": d + tq * se})
    return res


METRICS = [  # (label, reference key, seqvae key)
    ("IW-NLL (K=500)", "test/iw_nll", "test/iw_nll"),
    ("KL", "test/kl", "test/kl"),
    ("MI (per-batch estimator)", "test/mi", "test/mi"),
    ("AU (delta 0.01)", "test/au", "test/au"),
    ("-ELBO", "test/elbo", "test/loss"),
    ("rec", "test/rec", "test/rec"),
]


def load_metrics(d: str) -> list[tuple[str, dict]]:
    out = []
    for p in sorted(glob.glob(os.path.join(d, "seed*", "metrics.json"))):
        m = json.loads(Path(p).read_text())
        if m.get("status", "ok") == "ok" and "test/iw_nll" in m:
            out.append((p, m))
    return out


def run_compare(a) -> int:
    ref, sv = load_metrics(a.ref), load_metrics(a.seqvae)
    print(f"reference runs: {[p for p, _ in ref]}")
    print(f"seqvae runs:    {[p for p, _ in sv]}")
    if len(ref) < 2 or len(sv) < 2:
        print("need >= 2 finished runs on each side")
        return 1
    rows = []
    print("\n| metric | reference mean (n) | seqvae mean (n) | reference − seqvae [Welch 95% interval] | df |")
    print("|---|---|---|---|---|")
    for label, rk, sk in METRICS:
        x = [m[rk] for _, m in ref]
        y = [m[sk] for _, m in sv]
        r = welch(x, y)
        r.update({"metric": label, "reference_key": rk, "seqvae_key": sk, "reference": x, "seqvae": y})
        rows.append(r)
        holds0 = r["lo"] <= 0 <= r["hi"]
        df = "-" if r["df"] is None else f"{r['df']:.1f}"
        # 2 decimals, `diff [lo, hi]` in one cell, as `seqvae compare` writes them: the results pages quote
        # these cells verbatim and scripts/build_results.py --check looks them up (the JSON keeps full precision)
        degenerate = r["lo"] == r["hi"]
        note = " (same on every run: no spread, no interval)" if degenerate else (" (holds 0)" if holds0 else "*")
        print(f"| {label} | {r['mean_ref']:.2f} ({r['n_ref']}) | {r['mean_seqvae']:.2f} ({r['n_seqvae']}) | "
              f"{r['diff']:+.2f} [{r['lo']:+.2f}, {r['hi']:+.2f}]{note} | {df} |")
    if a.json:
        command = "python -m tools.reference " + " ".join(a.argv or sys.argv[1:])
        Path(a.json).write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    y = sub.add_parser("yahoo10k", help="run the reference on yahoo10k for one seed")
    y.add_argument("--he", required=True, help="clean clone (work tree) of jxhe/vae-lagging-encoder")
    y.add_argument("--he-commit", help="commit of the clone, if it is not a git work tree")
    y.add_argument("--seed", type=int, required=True, help="1..10 -> text.py --taskid seed-1 (its seed list)")
    y.add_argument("--out", required=True)
    y.add_argument("--work", help="patched copy of the clone (default /work/ref/work/seedN)")
    y.add_argument("--data-dir", default="/work/ref/data/yahoo10k")
    y.add_argument("--source", default=str(DEFAULT_SOURCE))
    y.add_argument("--epochs", type=int, default=20)
    y.add_argument("--iw-samples", type=int, default=500, help="multiple of 100 (calc_iwnll's ns)")
    y.add_argument("--limit-lines", type=int, help="smoke test: first N texts of each split")
    y.add_argument("--log", help="child output (default /tmp/reference_yahoo10k_seedN.log)")
    c = sub.add_parser("compare", help="reference - seqvae, Welch 95%% intervals")
    c.add_argument("--ref", default=str(REPO / "docs/results/reference_yahoo10k/he"))
    c.add_argument("--seqvae", default=str(REPO / "docs/results/yahoo10k_recipe20/last"))
    c.add_argument("--json", help="also write the rows here")
    for name, help_ in (("collect", "rebuild --out's metrics.json from its run's log"),
                        ("eval", "re-test the saved best checkpoint with text.py --eval")):
        e = sub.add_parser(name, help=help_)
        e.add_argument("--out", required=True, help="the run's out dir (with its config.json)")
    # listed for --help; `python -m tools.reference pin` runs tools/reference/pin.py with its own options
    sub.add_parser("pin", help="step-for-step pins against He et al.'s and Li et al.'s code (pin.py)", add_help=False)
    sub.add_parser("pin-sa", help="SA-VAE pinned to He et al.'s sa-vae branch (pin_savae.py)", add_help=False)
    a = ap.parse_args(argv)
    a.argv = argv
    return {"yahoo10k": run_yahoo10k, "compare": run_compare, "collect": run_collect, "eval": run_eval}[a.cmd](a)

