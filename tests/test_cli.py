"""End-to-end tests of the `seqvae` console script (fit / test / validate / resume / errors / download).

Every command is a real subprocess on a tiny generated corpus, with every logger save_dir and the
working directory inside pytest's tmp_path (nothing lands under runs/). The command is the `seqvae`
console script beside the interpreter, or, where there is none (an install without entry points,
or SEQVAE_TEST_NO_SCRIPT=1), the same CLI as `python -m seqvae`: these tests never skip. The
subprocesses import the `seqvae` of this checkout (its root leads PYTHONPATH), whatever is installed.

Each subprocess spends most of its time importing torch and Lightning, so running the ~20 commands
one after the other would not fit the time budget. Instead the commands are *jobs*: an autouse
module fixture starts, in the background, the jobs the selected tests need (critical-path jobs
first), at most `_PARALLEL` subprocesses at a time; each test then waits for its job's result and
asserts. Jobs that depend on another (e.g. `seqvae test` on the checkpoint of the main fit) wait
for it first. Running a single test (`-k ...`) starts only the jobs it needs.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / "configs" / "demo.yaml"
SEQVAE = None if os.environ.get("SEQVAE_TEST_NO_SCRIPT") else shutil.which("seqvae", path=str(Path(sys.executable).parent))
SEQVAE_COMMAND = [SEQVAE] if SEQVAE else [sys.executable, "-m", "seqvae"]
LATENT = 4
# Concurrent seqvae subprocesses (tiny models: one thread each). The suite is throughput-bound:
# ~20 processes of ~5 CPU-s each, nearly all of it importing torch and Lightning.
_PARALLEL = int(os.environ.get("SEQVAE_TEST_PARALLEL", "4"))
_TIMEOUT = 240  # seconds per subprocess; a hang fails the test instead of blocking the suite

TEST_KEYS = [
    "test/loss",
    "test/rec",
    "test/kl",
    "test/iw_nll",
    "test/iw_ppl",
    "test/elbo_ppl",
    "test/mi",
    "test/mi_dataset",
    "test/au",
    "test/feature_cos",
]
VAL_SCALARS = ["val/loss", "val/kl", "val/mi", "val/au", "val/feature_cos", "val/iw_nll"]
TRAIN_SCALARS = ["train/kl_weight", "train/lr", "train/loss"]
WORDS = "the a cat dog sat ran on mat under tree big small red blue saw ate fish bird happy sad".split()


# ------------------------------------------------------------------------------------- corpus
def make_corpus(root: Path) -> dict[str, Path]:
    """Deterministic tiny corpus: 100 train / 30 valid / 30 test lines of 2–6 words, plus the bad
    and the odd inputs the error tests feed in."""
    rng = random.Random(0)

    def lines(n):
        return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(n)]

    root.mkdir(parents=True, exist_ok=True)
    train = lines(100)
    files = {"train": train, "valid": lines(30), "test": lines(30)}
    paths = {}
    for name, text in files.items():
        paths[name] = root / f"{name}.txt"
        paths[name].write_text("\n".join(text) + "\n", encoding="utf-8")
    paths["empty"] = root / "empty.txt"
    paths["empty"].write_bytes(b"")
    paths["latin1"] = root / "latin1.txt"  # line 3 is not UTF-8
    paths["latin1"].write_bytes(b"the cat sat\na dog ran\nthe caf\xe9 was big\nred fish\n")
    long_line = " ".join(rng.choice(WORDS) for _ in range(10_000))
    paths["long"] = root / "long.txt"  # one 10,000-token line among the 100
    paths["long"].write_text("\n".join(train[:10] + [long_line] + train[10:]) + "\n", encoding="utf-8")
    paths["crlf"] = root / "crlf.txt"  # the training file, byte for byte, with \r\n endings
    paths["crlf"].write_bytes(("\r\n".join(train) + "\r\n").encode("utf-8"))
    paths["extra_key_yaml"] = root / "extra_key.yaml"
    paths["extra_key_yaml"].write_text("model:\n  nosuch: 1\n", encoding="utf-8")
    paths["bad_yaml"] = root / "bad.yaml"  # an unclosed flow list: line 3 is where YAML notices
    paths["bad_yaml"].write_text("model:\n  lr: [1\n  pooling: max\n", encoding="utf-8")
    paths["missing"] = root / "no_such_file.txt"
    return paths


def base_args(corpus: dict[str, Path], save_dir: Path, train: Path | None = None, epochs: int = 1) -> list[str]:
    return [
        "--config", str(DEMO_CONFIG),
        "--data.train", str(train or corpus["train"]),
        "--data.val", str(corpus["valid"]),
        "--data.test", str(corpus["test"]),
        "--data.batch_size", "16",
        "--model.embed_dim", "8",
        "--model.hidden_dim", "12",
        "--model.latent_dim", str(LATENT),
        "--model.val_iw_samples", "0",
        "--model.test_iw_samples", "3",
        "--trainer.max_epochs", str(epochs),
        "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", str(save_dir),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------- jobs
@dataclass
class Result:
    args: list[str]
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"seqvae {' '.join(self.args)}\nexit {self.returncode} after {self.seconds:.1f} s\n"
            f"--- stdout (tail)\n{self.stdout[-3000:]}\n--- stderr (tail)\n{self.stderr[-3000:]}"
        )

    def ok(self) -> Result:
        assert self.returncode == 0, self.describe()
        assert "Traceback" not in self.stderr, self.describe()
        return self

    @property
    def wrote(self) -> Path:
        """The metrics file the command reported (`seqvae: wrote PATH`)."""
        found = re.findall(r"^seqvae: wrote (.+)$", self.stdout, flags=re.M)
        assert len(found) == 1, self.describe()
        return Path(found[0])


class _Slots:
    """At most `n` holders; waiters are served by (priority, arrival), so that jobs on the critical
    path (the fit and the commands that need its checkpoint) never queue behind the independent ones."""

    def __init__(self, n: int):
        self.free, self.waiting, self.arrivals = n, [], itertools.count()
        self.cond = threading.Condition()

    @contextlib.contextmanager
    def __call__(self, priority: int):
        with self.cond:
            ticket = (priority, next(self.arrivals))
            heapq.heappush(self.waiting, ticket)
            self.cond.wait_for(lambda: self.free > 0 and self.waiting[0] == ticket)
            heapq.heappop(self.waiting)
            self.free -= 1
            self.cond.notify_all()
        try:
            yield
        finally:
            with self.cond:
                self.free += 1
                self.cond.notify_all()


_SLOTS = _Slots(_PARALLEL)
_LIVE: set[subprocess.Popen] = set()
_ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
}


def seqvae(args: list, cwd: Path, urgent: bool = False) -> Result:
    args = [str(a) for a in args]
    with _SLOTS(0 if urgent else 1):
        start = time.monotonic()
        proc = subprocess.Popen(
            [*SEQVAE_COMMAND, *args],
            cwd=cwd,
            env=_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
        )
        _LIVE.add(proc)
        try:
            out, err = proc.communicate(timeout=_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n[test harness: killed after {_TIMEOUT} s]"
        finally:
            _LIVE.discard(proc)
    return Result(args, proc.returncode, out, err, time.monotonic() - start)


class Jobs:
    """Named background jobs, each started at most once; `result(name)` starts it if needed and waits."""

    def __init__(self, specs: dict):
        self.specs = specs
        self.futures = {}
        self.lock = threading.Lock()
        self.pool = None

    def start(self, name: str):
        with self.lock:
            if self.pool is None:  # a thread per job: jobs waiting on another never starve it
                self.pool = ThreadPoolExecutor(max_workers=len(self.specs))
            if name not in self.futures:
                self.futures[name] = self.pool.submit(self.specs[name])
            return self.futures[name]

    def result(self, name: str):
        return self.start(name).result()

    def close(self):
        if self.pool is None:
            return
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in list(_LIVE):  # only our own children, by handle
            proc.kill()
        self.pool.shutdown(wait=True)
        if os.environ.get("SEQVAE_TEST_TIMES"):  # where the suite's time goes
            for name, fut in self.futures.items():
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    results = fut.result() if isinstance(fut.result(), tuple) else (fut.result(),)
                    times = [f"{r.seconds:.1f}" for r in results if isinstance(r, Result)]
                    print(f"job {name}: {' + '.join(times)} s", file=sys.stderr)


BAD_INPUTS = {
    # case: (extra args, substrings the error line must contain); {name} -> corpus paths
    "missing_train": (["--data.train", "{missing}"], ["data.train", "{missing}"]),
    "empty_train": (["--data.train", "{empty}"], ["data.train", "{empty}", "no non-empty lines"]),
    "non_utf8_line": (["--data.train", "{latin1}"], ["{latin1}:3", "UTF-8"]),
    "unknown_key": (["--model.nosuch", "1"], ["model.nosuch"]),
    "unknown_key_in_yaml": (["--config", "{extra_key_yaml}"], ["model.nosuch"]),
    "abbreviated_option": (["--trainer.max_epoch", "1"], ["--trainer.max_epoch"]),
    "invalid_pooling": (["--model.pooling", "nosuch"], ["model.pooling", "nosuch"]),
    "line_range_past_eof": (["--data.train_lines", "1-1000"], ["data.train", "{train}", "1-1000", "100 lines"]),
    "missing_checkpoint": (["--ckpt_path", "{missing}"], ["ckpt_path", "no such checkpoint file", "{missing}"]),
    "negative_seed": (["--seed_everything", "-2"], ["seed_everything: must be in [0, 2**32 - 1], got -2"]),
    "yaml_syntax_error": (["--config", "{bad_yaml}"], ["--config {bad_yaml}:3:", "not valid YAML"]),
    # every line longer than max_length: the error says so, not "no non-empty lines"
    "max_length_drops_every_line": (["--data.max_length", "1"], ["data.train", "data.max_length=1", "100 longer lines"]),
    # the language model has no z: a collapse fix given with it is refused, not recorded and dropped
    "latent0_with_bnvae": (["--model.latent_dim", "0", "--model.bn_gamma", "0.6"], ["model.bn_gamma", "model.latent_dim 0"]),
    "latent0_with_aggressive_and_skip": (
        ["--model.latent_dim", "0", "--model.aggressive", "seqvae.AggressiveTraining", "--model.skip", "true"],
        ["model.skip, model.aggressive", "model.latent_dim 0"],
    ),
    "latent0_with_free_bits": (["--model.latent_dim", "0", "--model.kl_penalty", "seqvae.FreeBits"], ["model.kl_penalty"]),
}
LATENT0_CASES = [case for case in BAD_INPUTS if case.startswith("latent0_")]
# Whole commands (not `fit` with the base arguments).
BAD_COMMANDS = {
    # no --config: the checkpoint is where the vocabulary would come from; its absence is the error
    "test_missing_checkpoint": (
        ["test", "--ckpt_path", "{missing}", "--data.test", "{test}"],
        ["ckpt_path", "no such checkpoint file", "{missing}"],
    ),
    # no --ckpt_path: Lightning evaluated the untrained initialisation and wrote its record (exit 0)
    "test_without_checkpoint": (
        ["test", "--data.train", "{train}", "--data.test", "{test}"],
        ["ckpt_path: `test` evaluates a trained model and none was given", "--ckpt_path RUN/checkpoints/best.ckpt"],
    ),
}


def _fill(s: str, corpus: dict[str, Path]) -> str:
    return s.format(**{k: str(v) for k, v in corpus.items()})


def build_jobs(tmp: Path, corpus: dict[str, Path]) -> Jobs:
    cwd = tmp / "cwd"  # nothing relative may land in the repository
    cwd.mkdir()
    specs: dict = {}
    jobs = Jobs(specs)
    main_save = tmp / "main"
    jobs.main_run = main_save / "demo" / "version_0"
    jobs.tmp = tmp
    resume_save = tmp / "resume"

    # Listed in start order: the two chains (fit -> test -> test, fit -> resumed fit) first; they
    # and the commands that need the fit's checkpoint are `urgent` (first in line for a slot).
    specs["fit"] = lambda: seqvae(
        ["fit", *base_args(corpus, main_save, epochs=2), "--model.val_iw_samples", "2", "--trainer.log_every_n_steps", "1"],
        cwd,
        urgent=True,
    )

    def run_dir():
        jobs.result("fit").ok()
        return jobs.main_run

    def test_twice():
        run = run_dir()
        cmd = ["test", "--config", run / "config.yaml", "--ckpt_path", run / "checkpoints" / "best.ckpt"]
        first = seqvae(cmd, cwd, urgent=True)
        snapshot = {p: p.read_bytes() for p in main_save.rglob("metrics*.json")}
        second = seqvae(cmd, cwd, urgent=True)
        return first, snapshot, second

    specs["test_twice"] = test_twice
    specs["resume_first"] = lambda: seqvae(
        ["fit", *base_args(corpus, resume_save), "--trainer.logger.init_args.version", "v"], cwd, urgent=True
    )

    def resume_second():  # the finished run v: refused in place, then trained further into v2 from its last.ckpt
        first = jobs.result("resume_first").ok()
        run = resume_save / "demo" / "v"
        before = files(run)
        args = [*base_args(corpus, resume_save, epochs=2), "--model.test_iw_samples", "4"]  # evaluation: may change
        last = ["--ckpt_path", run / "checkpoints" / "last.ckpt"]
        in_place = seqvae(["fit", *args, "--trainer.logger.init_args.version", "v", *last], cwd, urgent=True)
        after = files(run)
        second = seqvae(["fit", *args, "--trainer.logger.init_args.version", "v2", *last], cwd)
        return first, before, in_place, after, second, files(run)

    specs["resume_second"] = resume_second
    specs["validate"] = lambda: seqvae(
        [
            "validate", "--config", run_dir() / "config.yaml", "--ckpt_path", run_dir() / "checkpoints" / "best.ckpt",
            "--trainer.logger.init_args.save_dir", tmp / "validate",
        ],
        cwd,
        urgent=True,
    )  # fmt: skip
    specs["partial_test"] = lambda: seqvae(
        [
            "test", "--config", run_dir() / "config.yaml", "--ckpt_path", run_dir() / "checkpoints" / "best.ckpt",
            "--trainer.logger.init_args.save_dir", tmp / "partial", "--trainer.limit_test_batches", "1",
        ],
        cwd,
    )  # fmt: skip
    for name, extra in {
        "long_line": ["--data.train", corpus["long"]],
        "long_line_skipped": ["--data.train", corpus["long"], "--data.max_length", "200"],
        "crlf": ["--data.train", corpus["crlf"]],
        "no_val_or_test": ["--data.val", "null", "--data.test", "null"],
    }.items():
        specs[name] = lambda name=name, extra=extra: seqvae(["fit", *base_args(corpus, tmp / name), *extra], cwd)
    for case, (extra, _) in BAD_INPUTS.items():
        args = ["fit", *base_args(corpus, tmp / f"bad_{case}"), *(_fill(a, corpus) for a in extra)]
        specs[f"bad:{case}"] = lambda args=args: seqvae(args, cwd)
    for case, (command, _) in BAD_COMMANDS.items():
        args = [_fill(a, corpus) for a in command]
        specs[f"bad:{case}"] = lambda args=args: seqvae(args, cwd)

    def files(root: Path) -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    def refit_finished_run():  # fit again into the crlf run's directory, without --ckpt_path
        run = jobs.result("crlf").ok().wrote.parent
        before = files(run)
        args = [*base_args(corpus, tmp / "crlf", train=corpus["crlf"]), "--trainer.logger.init_args.version", run.name]
        return run, before, seqvae(["fit", *args], cwd), files(run)

    specs["refit_finished_run"] = refit_finished_run

    def resume_moved_run():  # the crlf run copied to another directory and resumed there
        run = jobs.result("crlf").ok().wrote.parent
        moved = tmp / "moved" / "demo" / run.name
        shutil.copytree(run, moved)
        for name in ("metrics.json", "per_text.csv"):  # as an interrupted run's copy: a finished run is not resumed
            (moved / name).unlink()
        args = [*base_args(corpus, tmp / "moved", train=corpus["crlf"], epochs=2), "--trainer.logger.init_args.version", run.name]
        return moved, seqvae(["fit", *args, "--ckpt_path", moved / "checkpoints" / "last.ckpt"], cwd)

    specs["resume_moved_run"] = resume_moved_run

    def test_beside_finished_run():  # a run's config.yaml naming its fixed version, as a sweep cell's does
        run = jobs.result("crlf").ok().wrote.parent
        before = files(run)
        fixed = ["--trainer.logger.init_args.version", run.name]
        result = seqvae(["test", "--config", run / "config.yaml", *fixed, "--ckpt_path", run / "checkpoints" / "best.ckpt"], cwd)
        return run, before, result, files(run)

    specs["test_beside_finished_run"] = test_beside_finished_run

    def refused_test_beside_finished_run():  # the same with a test file that is not UTF-8: refused, and silent about a directory
        original = jobs.result("crlf").ok().wrote.parent
        run = tmp / "refused" / "demo" / original.name  # a copy: another job writes beside the original
        shutil.copytree(original, run)
        before = sorted(p for p in run.parent.rglob("*"))
        fixed = ["--trainer.logger.init_args.save_dir", tmp / "refused", "--trainer.logger.init_args.version", run.name]
        fixed += ["--data.test", corpus["latin1"]]
        result = seqvae(["test", "--config", run / "config.yaml", *fixed, "--ckpt_path", run / "checkpoints" / "best.ckpt"], cwd)
        return run, before, result, sorted(p for p in run.parent.rglob("*"))

    specs["refused_test_beside_finished_run"] = refused_test_beside_finished_run

    def resume_with_other_vocabulary():  # the main run's checkpoint, a vocabulary cut to 10 words
        run = run_dir()
        save = tmp / "other_vocabulary"
        args = [*base_args(corpus, save), "--data.max_vocab", "10", "--ckpt_path", run / "checkpoints" / "last.ckpt"]
        return save, seqvae(["fit", *args], cwd)

    specs["resume_with_other_vocabulary"] = resume_with_other_vocabulary

    def resume_last_with_other_vocabulary():  # `--ckpt_path last` names the main run's last.ckpt too
        run = run_dir()
        before = files(run)
        where = ["--trainer.logger.init_args.save_dir", run.parents[1], "--trainer.logger.init_args.name", run.parent.name]
        last = [*base_args(corpus, tmp), *where, "--ckpt_path", "last"]
        other = seqvae(["fit", *last, "--trainer.logger.init_args.version", run.name, "--data.max_vocab", "10"], cwd)
        missing = seqvae(["fit", *last, "--trainer.logger.init_args.version", "no_such_run"], cwd)
        return run, before, other, missing, files(run)

    specs["resume_last_with_other_vocabulary"] = resume_last_with_other_vocabulary

    def resume_with_other_settings():  # the resumed run once more, with another pooling and learning rate (issue 45)
        jobs.result("resume_second")
        run = resume_save / "demo" / "v"
        before = files(run)
        args = [*base_args(corpus, resume_save, epochs=3), "--trainer.logger.init_args.version", "v", "--ckpt_path", "last"]
        return run, before, seqvae(["fit", *args, "--model.pooling", "avg", "--model.lr", "0.1"], cwd), files(run)

    specs["resume_with_other_settings"] = resume_with_other_settings
    specs["download_help"] = lambda: seqvae(["download", "--help"], cwd)

    def fast_dev_run():  # in a working directory of its own: it must stay empty
        own = tmp / "fast_dev_run_cwd"
        own.mkdir()
        save = tmp / "fast_dev_run"
        return own, save, seqvae(["fit", *base_args(corpus, save), "--trainer.fast_dev_run", "2"], own)

    specs["fast_dev_run"] = fast_dev_run

    # DDP on CPU (gloo, 2 processes): fit (with mid-epoch checkpoints) then its own test of the
    # best checkpoint; a single-process test of the same checkpoint must give the same metrics.
    ddp_save = tmp / "ddp"
    ddp_args = [
        *base_args(corpus, ddp_save), "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu",
        "--periodic_checkpoint.every_n_batches", "2", "--model.val_iw_samples", "2",
        # a fixed version, as a sweep cell's: rank 1 must not take rank 0's new run for a finished one
        "--trainer.logger.init_args.version", "seed1",
    ]  # fmt: skip
    specs["ddp_fit"] = lambda: seqvae(["fit", *ddp_args], cwd, urgent=True)

    def ddp_single_test():
        jobs.result("ddp_fit").ok()
        run = ddp_save / "demo" / "seed1"
        single = ["--trainer.strategy", "auto", "--trainer.devices", "1"]
        return seqvae(["test", "--config", run / "config.yaml", "--ckpt_path", run / "checkpoints" / "best.ckpt", *single], cwd)

    specs["ddp_single_test"] = ddp_single_test
    aggressive = ["--model.aggressive", "seqvae.AggressiveTraining", "--trainer.logger.init_args.version", "aggressive"]
    specs["ddp_aggressive"] = lambda: seqvae(["fit", *ddp_args, *aggressive], cwd)
    return jobs


def needs(*names):
    """Declares the jobs a test waits for ("{case}" is filled from its parameters)."""

    def mark(fn):
        fn.needs = names
        return fn

    return mark


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module", autouse=True)
def jobs(request, corpus, tmp_path_factory):
    jobs = build_jobs(tmp_path_factory.mktemp("e2e"), corpus)
    wanted = set()
    for item in request.session.items:
        if getattr(item, "module", None) is request.module:
            params = getattr(getattr(item, "callspec", None), "params", {})
            wanted.update(n.format(**params) for n in getattr(item.function, "needs", ()))
    for name in jobs.specs:  # in the specs' order: the critical paths first
        if name in wanted:
            jobs.start(name)
    yield jobs
    jobs.close()


@pytest.fixture(scope="module")
def main_run(jobs) -> Path:
    jobs.result("fit").ok()
    return jobs.main_run


def load_metrics(path: Path) -> dict:
    return json.loads(path.read_text())


# ------------------------------------------------------------------------------------- 1. fit
@needs("fit")
def test_the_seed_is_said_in_seqvaes_line_not_lightnings(jobs, main_run):
    stderr = jobs.result("fit").stderr
    seed = yaml.safe_load((main_run / "config.yaml").read_text())["seed_everything"]
    assert f"seqvae: vocabulary 24 ids; seed {seed}; run directory {main_run}" in stderr.splitlines(), stderr
    assert "Seed set to" not in stderr and "TPU available: False" not in stderr


@needs("fit")
def test_fit_run_directory(main_run):
    for name in ("config.yaml", "hparams.yaml", "vocab.json", "metrics.json", "checkpoints/best.ckpt", "checkpoints/last.ckpt"):
        assert (main_run / name).is_file(), f"{name} missing from {sorted(p.name for p in main_run.rglob('*'))}"
    assert list(main_run.glob("events.out.tfevents.*")), "no TensorBoard event file"
    assert not list(main_run.glob("metrics-*.json")), "fit wrote more than one metrics file"


@needs("fit")
def test_fit_metrics(main_run, corpus):
    m = load_metrics(main_run / "metrics.json")
    missing = [k for k in [*TEST_KEYS, "updates", "fit_seconds"] if k not in m]
    assert not missing, f"metrics.json lacks {missing}: {sorted(m)}"
    for k in [*TEST_KEYS, "updates", "fit_seconds"]:
        assert isinstance(m[k], (int, float)) and math.isfinite(m[k]), (k, m[k])
    assert m["updates"] > 0 and m["fit_seconds"] > 0
    assert m["test/loss"] == pytest.approx(m["test/rec"] + m["test/kl"], rel=1e-4, abs=1e-4)
    # IW-NLL bounds -ELBO in expectation; both are one stochastic estimate, hence the slack.
    assert m["test/iw_nll"] <= m["test/loss"] + 0.02 * abs(m["test/loss"]) + 0.1
    assert m["test/iw_nll"] > 0 and m["test/rec"] > 0 and m["test/kl"] > -1e-4
    assert 0 <= m["test/au"] <= LATENT
    # Perplexities are per predicted token of the test split (the n words and </s>).
    test = m["data"]["test"]
    assert test["texts"] == 30 and test["predicted_tokens"] == test["tokens"] + 30
    per_token = test["texts"] / test["predicted_tokens"]
    assert m["test/elbo_ppl"] == pytest.approx(math.exp(m["test/loss"] * per_token), rel=1e-3)
    assert m["test/iw_ppl"] == pytest.approx(math.exp(m["test/iw_nll"] * per_token), rel=1e-3)
    assert m["data"]["train"]["texts"] == 100 and m["data"]["train"]["too_long_skipped"] == 0
    assert Path(m["best_checkpoint"]) == main_run / "checkpoints" / "best.ckpt"


@needs("fit")
def test_fit_tensorboard_scalars(main_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(main_run), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    missing = [t for t in VAL_SCALARS + TRAIN_SCALARS if t not in tags]
    assert not missing, f"event files lack {missing}; have {sorted(tags)}"
    for tag in VAL_SCALARS + TRAIN_SCALARS:
        assert all(math.isfinite(e.value) for e in acc.Scalars(tag)), tag
    assert len(acc.Scalars("val/loss")) == 2  # one per epoch (the sanity check is not logged)
    assert len(acc.Scalars("train/loss")) > 2  # per step with log_every_n_steps 1


# ------------------------------------------------------------------------------------- 2. test
@needs("fit", "test_twice")
def test_test_subcommand_never_overwrites(jobs, main_run):
    first, snapshot, second = jobs.result("test_twice")
    fit_metrics = main_run / "metrics.json"
    for result in (first, second):
        result.ok()
        for key in TEST_KEYS:
            printed = re.search(rf"^\s+{re.escape(key)}\s+-?\d", result.stdout, flags=re.M)
            assert printed, f"{key} not printed\n{result.describe()}"
        m = load_metrics(result.wrote)
        assert all(math.isfinite(m[k]) for k in TEST_KEYS)
        assert m["checkpoint"] == str(main_run / "checkpoints" / "best.ckpt")
    # Where they land: each `test` run gets the next logger version of the same save_dir/name.
    assert first.wrote != fit_metrics and first.wrote.name == "metrics.json"
    assert first.wrote.parent.parent == main_run.parent
    assert second.wrote not in snapshot, f"second test wrote over {second.wrote}"
    assert fit_metrics in snapshot and first.wrote in snapshot
    for path, data in snapshot.items():
        assert path.read_bytes() == data, f"{path} changed"


# ------------------------------------------------------------------------------------- 3. resume
@needs("resume_first", "resume_second")
def test_a_finished_run_is_trained_further_in_another_directory_never_in_place(jobs):
    first, before, in_place, after, second, after_second = jobs.result("resume_second")
    run = first.wrote.parent
    assert first.wrote == run / "metrics.json" and run.name == "v"
    # in place: one line, and the finished run untouched (before: a metrics-2.json that compare and export never read)
    assert_one_error_line(in_place, ["ckpt_path", f"{run} is a finished run", "trainer.logger.init_args.version"])
    assert after == before
    second.ok()
    longer = run.parent / "v2"
    assert second.wrote == longer / "metrics.json"
    # max_epochs and test_iw_samples may change on resume: said in one line, and config.yaml and
    # hparams.yaml record the values that ran
    changes = "model.test_iw_samples 3 -> 4, trainer.logger.init_args.version v -> v2, trainer.max_epochs 1 -> 2"
    assert f"seqvae: resuming {run / 'checkpoints' / 'last.ckpt'} with {changes} (" in second.stderr, second.describe()
    recorded = yaml.safe_load((longer / "config.yaml").read_text())
    assert recorded["trainer"]["max_epochs"] == 2 and recorded["model"]["test_iw_samples"] == 4
    assert recorded["ckpt_path"] == str(run / "checkpoints" / "last.ckpt")
    assert "test_iw_samples: 4\n" in (longer / "hparams.yaml").read_text()
    m1, m2 = load_metrics(run / "metrics.json"), load_metrics(longer / "metrics.json")
    assert m1["epochs"] == 1 and m2["epochs"] == 2
    assert m2["updates"] == 2 * m1["updates"], "the update count did not continue from the checkpoint"
    assert m2["fit_seconds"] >= m1["fit_seconds"]
    assert all(math.isfinite(m2[k]) for k in TEST_KEYS)
    assert after_second == before, "training further touched the finished run"


@needs("fit", "partial_test")
def test_a_partial_test_says_how_many_texts_it_tested(jobs, main_run):
    result = jobs.result("partial_test").ok()
    m = load_metrics(result.wrote)
    rows = (result.wrote.parent / m["per_text_file"]).read_text().splitlines()[1:]
    tested = m["tested_texts"]
    assert 0 < tested == len(rows) < 30 and m["data"]["test"]["texts"] == 30
    assert m["partial_test"]["broken"] is True and m["partial_test"]["texts"] == tested
    assert f"seqvae: test: {tested} of 30 texts (trainer.limit_test_batches 1), IW-NLL with K = 3" in result.stderr, (
        result.describe()
    )
    assert f"seqvae: warning: tested on {tested} of the test file's 30 texts" in result.stderr
    full = load_metrics(main_run / "metrics.json")
    assert full["tested_texts"] == 30 and "partial_test" not in full


# ------------------------------------------------------------------------------------- 4. validate
@needs("fit", "validate")
def test_validate_subcommand(jobs):
    result = jobs.result("validate").ok()
    assert "val/loss" in result.stdout, result.describe()


# ------------------------------------------------------------------------------------- 5. bad input
def assert_one_error_line(result: Result, expected: list[str]) -> None:
    assert result.returncode not in (0, None), result.describe()
    assert "Traceback" not in result.stderr, result.describe()
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("seqvae: error:"), result.describe()
    noise = ("Seed set to", "GPU available: False", "TPU available: False")  # Lightning's, silenced (cli.py `_KnownNoise`)
    assert not [x for x in result.stderr.splitlines() if x.startswith(noise)], result.describe()
    for part in expected:
        assert part in last, f"{part!r} not in {last!r}"


@needs("bad:{case}")
@pytest.mark.parametrize("case", [*BAD_INPUTS, *BAD_COMMANDS])
def test_bad_input_is_one_error_line(jobs, corpus, case):
    expected = (BAD_INPUTS.get(case) or BAD_COMMANDS[case])[1]
    assert_one_error_line(jobs.result(f"bad:{case}"), [_fill(e, corpus) for e in expected])


@needs("bad:{case}")
@pytest.mark.parametrize("case", LATENT0_CASES)
def test_language_model_with_a_z_option_leaves_no_run_directory(jobs, case):
    jobs.result(f"bad:{case}")
    save = jobs.tmp / f"bad_{case}"
    assert not save.exists() or not any(p.is_file() for p in save.rglob("*"))


@needs("refit_finished_run")
def test_fit_into_a_finished_run_is_refused_and_changes_nothing(jobs):
    run, before, result, after = jobs.result("refit_finished_run")
    assert_one_error_line(result, ["trainer.logger.init_args.version", f"{run} already holds a finished run", "--ckpt_path"])
    assert "resume it" not in result.stderr  # a finished run is not resumed in place: the advice must not say so
    assert after == before  # no new events file, no checkpoint or metrics touched


@needs("test_beside_finished_run")
def test_testing_a_fixed_version_run_writes_beside_it(jobs):
    run, before, result, after = jobs.result("test_beside_finished_run")
    result.ok()
    assert f"seqvae: {run} holds a finished run: this test writes to a new version_N beside it" in result.stderr
    assert result.wrote.parent.parent == run.parent and result.wrote.parent != run
    assert after == before  # the finished run is untouched: no events file, no metrics-2.json


@needs("refused_test_beside_finished_run")
def test_a_refused_test_beside_a_finished_run_announces_no_directory(jobs, corpus):
    run, before, result, after = jobs.result("refused_test_beside_finished_run")
    assert_one_error_line(result, [f"{corpus['latin1']}:3: not valid UTF-8"])
    assert "holds a finished run" not in result.stderr, result.describe()  # before: "this test writes to a new version_N"
    assert after == before  # nothing beside the run, nothing in it


@needs("resume_moved_run")
def test_a_moved_run_resumes_into_its_own_checkpoint_files(jobs):
    moved, result = jobs.result("resume_moved_run")
    result.ok()
    assert sorted(p.name for p in (moved / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]  # no best-v1.ckpt
    assert load_metrics(result.wrote)["best_checkpoint"] == str(moved / "checkpoints" / "best.ckpt")


@needs("resume_with_other_vocabulary", "fit")
def test_resume_with_another_vocabulary_is_one_error_line(jobs, main_run):
    save, result = jobs.result("resume_with_other_vocabulary")
    assert_one_error_line(result, ["ckpt_path", "another vocabulary", "(14 ids; ", "words missing or at other ids", "data.train"])
    assert not save.exists() or not any(p.is_file() for p in save.rglob("*"))


@needs("resume_with_other_settings")
def test_resume_with_settings_that_change_the_computation_is_one_error_line(jobs):
    run, before, result, after = jobs.result("resume_with_other_settings")
    assert_one_error_line(result, ["ckpt_path", "other settings", "model.lr 1.0 -> 0.1", "model.pooling max -> avg"])
    assert "max_epochs" not in result.stderr.strip().splitlines()[-1]  # a resume may change it
    assert after == before, "a refused resume wrote into the run"


@needs("resume_last_with_other_vocabulary", "fit")
def test_resume_from_last_is_checked_like_a_path(jobs, main_run):
    run, before, other, missing, after = jobs.result("resume_last_with_other_vocabulary")
    assert_one_error_line(other, ["ckpt_path", f"{run}/checkpoints/last.ckpt", "another vocabulary", "(14 ids; "])
    # no last.ckpt to resume: refused (Lightning would train from scratch), no run directory made
    assert_one_error_line(missing, ["ckpt_path: last: no ", "no_such_run/checkpoints/last.ckpt to resume"])
    assert not (run.parent / "no_such_run").exists() and after == before


@needs("long_line")
def test_long_line_trains(jobs):
    result = jobs.result("long_line").ok()
    train = load_metrics(result.wrote)["data"]["train"]
    assert train["texts"] == 101 and train["too_long_skipped"] == 0


@needs("long_line_skipped")
def test_long_line_skipped_with_max_length(jobs):
    result = jobs.result("long_line_skipped").ok()
    m = load_metrics(result.wrote)
    assert m["data"]["train"]["too_long_skipped"] == 1 and m["data"]["train"]["texts"] == 100
    assert "1 too-long lines skipped" in result.stderr
    assert all(math.isfinite(m[k]) for k in TEST_KEYS)


@needs("no_val_or_test")
def test_fit_without_val_or_test_files_says_it_uses_the_training_texts(jobs):
    result = jobs.result("no_val_or_test").ok()
    data = load_metrics(result.wrote)["data"]
    assert data["val"]["sha256"] == data["test"]["sha256"] == data["train"]["sha256"]  # what the warnings say
    for split in ("val", "test"):
        assert f"seqvae: warning: data.{split} is not given:" in result.stderr, result.describe()
        assert f"--data.{split} FILE or FILE#FIRST-LAST" in result.stderr


@needs("crlf", "fit")
def test_crlf_line_endings(jobs, main_run, corpus):
    result = jobs.result("crlf").ok()
    run = result.wrote.parent
    # \r\n is whitespace: same vocabulary and counts as the \n file of the main run.
    vocab = json.loads((run / "vocab.json").read_text())["tokenizer"]["model"]["vocab"]
    assert not [w for w in vocab if "\r" in w]
    assert vocab == json.loads((main_run / "vocab.json").read_text())["tokenizer"]["model"]["vocab"]
    crlf, lf = (load_metrics(path)["data"]["train"] for path in (result.wrote, main_run / "metrics.json"))
    assert crlf.pop("file") == str(corpus["crlf"]) and lf.pop("file") == str(corpus["train"])
    assert crlf == lf  # counts and the texts' sha256 too


# ------------------------------------------------------------------------------------- 6. Python API
@needs("fit")
def test_python_api_from_checkpoint(main_run):
    import torch

    from seqvae import SeqVAE

    model = SeqVAE.load_from_checkpoint(main_run / "checkpoints" / "best.ckpt", map_location="cpu")
    mu, logvar = model.encode(["a b"])
    assert mu.shape == (1, LATENT) and logvar.shape == (1, LATENT)
    assert torch.isfinite(mu).all() and torch.isfinite(logvar).all()
    texts = ["the cat sat on the mat", "a dog", "unseen words here"]
    nll = model.iw_nll(texts, n_samples=3)
    assert nll.shape == (3,) and torch.isfinite(nll).all() and (nll >= 0).all()


# ------------------------------------------------------------------------------------- 7. download
@needs("fast_dev_run")
def test_fast_dev_run_trains_tests_and_writes_nothing(jobs):
    own_cwd, save_dir, result = jobs.result("fast_dev_run")
    result.ok()
    assert "test/iw_nll" in result.stdout  # the test after fit ran
    assert "metrics.json not written" in result.stderr
    assert list(own_cwd.iterdir()) == []  # Lightning would leave checkpoints/last.ckpt here
    assert not save_dir.exists() or not any(p.is_file() for p in save_dir.rglob("*"))


@needs("download_help")
def test_download_help_dispatches(jobs):
    result = jobs.result("download_help").ok()
    assert "usage" in result.stdout.lower() and "download" in result.stdout, result.describe()


# ------------------------------------------------------------------------------------- DDP
@needs("ddp_fit", "ddp_single_test")
def test_ddp_fit_and_test_match_single_process_metrics(jobs):
    ddp = jobs.result("ddp_fit").ok()
    single = jobs.result("ddp_single_test").ok()
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in ddp.stderr, ddp.describe()
    a, b = load_metrics(ddp.wrote), load_metrics(single.wrote)
    for key in TEST_KEYS:  # every text evaluated once; the noise of each batch as in one process
        assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-6), (key, a[key], b[key])
    # The sampled values (rec, IW-NLL, MI, MI-dataset) agree only if every batch got the noise
    # it gets in one process and the pooled posteriors are in the single-process order.
    assert abs(a["test/mi"]) > 0.01 and abs(a["test/mi_dataset"]) > 1e-3 and 0 < a["test/feature_cos"] < 1
    assert [p.name for p in ddp.wrote.parent.glob("metrics*.json")] == ["metrics.json"]  # rank 0 writes


@needs("ddp_aggressive")
def test_ddp_refuses_aggressive_training_in_one_line(jobs):
    result = jobs.result("ddp_aggressive")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.describe()
    assert "seqvae: error: model.aggressive: aggressive training is not supported under DDP" in result.stderr
