"""Throughput benchmark of SeqVAE: GEMM peak, training tokens/s, IW-NLL documents/s, peak memory.

    python -m benchmarks.bench [--quick] [--threads N] [--device cpu|cuda] [--bf16] [--configs small,paper] [--json PATH]
    python -m benchmarks.bench --profile [--threads N]   # torch.profiler op tables of the small config
    python -m benchmarks.bench --allocator [--steps 10] [--docs 4] [--iw-samples 100]   # glibc default vs seqvae's

`--allocator`: CPU time of the small config's training steps (32 random texts of 80 tokens) and of
IW-NLL per document, under glibc's default malloc and under `seqvae.training.allocator.reuse_freed_memory`,
each in its own process (the thresholds are per process), one torch thread. Per step/document:
wall, user and system CPU seconds and minor page faults (getrusage). System time and faults are
what the setting removes; other processes inflate wall time, not this process's CPU times. The last
training loss and the IW-NLL sum are printed under both settings: they must be equal to the bit.

It measures what `seqvae` runs, with the glibc allocator setting of the `seqvae` command
(`allocator.reuse_freed_memory`). The parts, per config:
- `train`: the model's `loss_terms` + backward + clip + SGD in a plain loop (no Lightning);
- `fit`: the real training step through `Trainer.fit` (`trainer_path.py`: the model's own
  `training_step` with its host reads, finite check and logging, `MatmulPrecision`, Lightning's
  batch copy), so the Trainer's cost is `fit` − `train` on the same batches;
- `iw`: `metrics.iw_nll` called directly on one text (`--quick`) or a few at once, in decoder calls
  of `iw_chunk` samples of those texts (at B = 1 many more per call than `seqvae test` makes);
- `test`: IW-NLL as `seqvae test` computes it: `Trainer.test` and the model's `test_step` on
  batches of 32 texts (`data.eval_batch_size`), K = `--iw-samples` in decoder calls of
  `model.iw_chunk` samples of the 32-text batch (on the CPU at the paper size not measured:
  ~32 × the `iw` figure per batch);
- `aggressive`: the three updates of aggressive training.
`train`, `iw` and `aggressive` run once with the fused output layer + cross-entropy
(`fused_output=True`, the default) and once with the plain logits path (`fused_output=False`);
`fit` and `test` with the default. Every measurement (config × path × part) runs in a child process
of its own, so its peak RSS (`ru_maxrss`) is that measurement's alone; on CUDA, where each child
would pay ~10 s of CUDA's start-up for a second of work, one child per config runs its
measurements one after the other (peak CUDA memory still per measurement, peak RSS of the child).

Every figure has wall and CPU seconds (`time.process_time` of the measuring process) and the
1-minute load average around it: on a machine shared with other work the wall time grows with
the load, the CPU time much less, so compare CPU times there. The TF32 state (on CUDA: matmul
precision, `allow_tf32` of matmuls and cuDNN as the measurement left them; the GEMM peak's in the
header) is printed and kept in the JSON; "n/a (cpu)" on the CPU.

Analytic FLOPs (multiply-add = 2 FLOPs; GEMMs only: embedding lookups, gate nonlinearities,
softmax/cross-entropy, the posterior layer and z -> c0 are not counted). For a bucket batch of
B sequences of T tokens (`<s> … </s>`), P = B·(T-1) predicted tokens:

    F_fwd(batch) = B·T·8H(E+H)  +  B·(T-1)·[8H(E+Z+H) + 2HV]
                   encoder LSTM     decoder LSTM (input [emb; z]) + output layer
    F_train = 3·F_fwd   (backward = 2× forward);  per predicted token: F_train / P
    F_iw(doc) = T·8H(E+H) + K·(T-1)·[8H(E+Z+H) + 2HV]   (encoder once, decoder per sample)

"Fraction of peak" = achieved FLOP/s ÷ the peak: the best FLOP/s, in the same dtype and run, of
the square 2048³ and 4096³ GEMMs and each config's own output-layer and LSTM-step GEMMs
(`gemm_peak.py`; the square 2048³ alone was exceeded, issue 37). The shape that set it is printed
and kept in the JSON; a rate above it is printed as such, with no fraction (`fraction_of_peak`
null, `above_peak_by` in the JSON).
Warm-up iterations are excluded from every timing, and have the timed shapes: the warm-up steps
are the first timed batches again, the IW warm-up one decoder call of the timed size. On cuda
every timing is bracketed by syncs (`fit`/`test`: at its two ends only, as the real loop runs).
Other processes on the machine lower every wall figure: read them as lower bounds.
"""

from __future__ import annotations

import argparse  # noqa: E401
import contextlib
import json
import logging
import math
import os
import resource
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

from benchmarks.gemm_peak import measure_peak, peak_shapes, rate_against_peak
from benchmarks.trainer_path import stamp, timed_fit, timed_test
from seqvae.core.metrics import iw_nll
from seqvae.core.model import SeqVAE
from seqvae.text.corpus import Vocabulary, read_corpus
from seqvae.text.samplers import BucketBatchSampler
from seqvae.training.allocator import reuse_freed_memory
from seqvae.training.precision import set_tf32

CONFIGS = {"small": dict(embed_dim=64, hidden_dim=128, latent_dim=32, vocab_size=5000),  # first: RSS is a lifetime peak
           "paper": dict(embed_dim=512, hidden_dim=1024, latent_dim=32, vocab_size=20000)}  # fmt: skip
QUICK = {"paper": (1, 2, 1), "small": (1, 5, 1)}  # warm-up steps, timed steps, IW documents
FULL = {"paper": (2, 10, 2), "small": (3, 40, 8)}
TEST_BATCHES = {True: 1, False: 2}  # --quick or not: timed batches of `seqvae test`'s size (+1 warm-up batch)
CUDA_STEPS = {True: (5, 30), False: (10, 100)}  # --quick or not: warm-up and timed steps on a GPU
REPO = Path(__file__).resolve().parents[1]
YAHOO = REPO.parent / "shared/data/yahoo/valid.txt"
BATCH = 32  # sentences per batch: `data.batch_size` and `data.eval_batch_size` of every config
WARM_T = 24  # tools/reference/speed.py's warm-up length (bench.py warms up at the timed shapes)


def autocast(device, bf16):
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def memory(device) -> dict:
    out = {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # KiB on Linux
    if device.type == "cuda":
        out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    return out


def sizes(name: str, quick: bool, device_type: str) -> tuple[int, int, int, int]:
    """Warm-up steps, timed steps, texts of `iw`, timed batches of `test`. On a GPU a paper-size
    step takes milliseconds and 2 timed steps would mostly time the launch queue filling: more
    steps and test batches there."""
    warm, steps, n_docs = (QUICK if quick else FULL)[name]
    if device_type == "cuda":
        return *CUDA_STEPS[quick], n_docs, 4 * TEST_BATCHES[quick]
    return warm, steps, n_docs, TEST_BATCHES[quick]


def tf32_state(device) -> dict | str:
    """How fp32 products ran: torch's settings as the measurement left them (on CUDA); on the CPU
    TF32 does not exist."""
    if device.type != "cuda":
        return "n/a (cpu)"

    def read(get):  # torch >= 2.9 refuses some reads once its legacy and new TF32 APIs were mixed
        try:
            return get()
        except RuntimeError as err:
            return f"unreadable: {str(err)[:120]}"

    matmul = torch.backends.cuda.matmul

    def precision():
        try:
            return matmul.fp32_precision
        except AttributeError:  # torch < 2.9: the global setting
            return torch.get_float32_matmul_precision()

    return {"matmul_fp32_precision": read(precision),
            "matmul_allow_tf32": read(lambda: matmul.allow_tf32), "cudnn_allow_tf32": read(lambda: torch.backends.cudnn.allow_tf32)}  # fmt: skip


def flops_fwd(cfg, B, T, K=1, encoder_once=False) -> float:
    E, H, Z, V = cfg["embed_dim"], cfg["hidden_dim"], cfg["latent_dim"], cfg["vocab_size"]
    return (1 if encoder_once else B) * T * 8 * H * (E + H) + B * K * (T - 1) * (8 * H * (E + Z + H) + 2 * H * V)


def yahoo_batches(path: Path, vocab_size: int, n: int, seed: int = 0):
    """n equal-length batches of 32: Yahoo text if present, else synthetic ids of Yahoo lengths.
    Of the full buckets (as BucketBatchSampler cuts them) the n closest to the mean length."""
    if path.is_file():
        corpus = read_corpus(path)
        ids = Vocabulary.build(corpus.texts, unk_token="_UNK", max_size=vocab_size - 4).encode(corpus.texts)
        lengths = [len(x) for x in ids]
        mean = sum(lengths) / len(lengths)
        full = [b for b in BucketBatchSampler(lengths, BATCH, shuffle=True, seed=seed) if len(b) == BATCH]
        full.sort(key=lambda b: abs(lengths[b[0]] - mean))  # stable: ties keep the shuffled order
        tokens = [torch.tensor([ids[i] for i in b]) for b in full[:n]]
        source = f"{path.name}: {len(ids)} texts, mean length {mean:.1f} tokens incl. <s> </s>"
    else:
        g = torch.Generator().manual_seed(seed)  # lognormal lengths: mean ~80, median 70, max 200
        lens = (torch.randn(max(n, 300), generator=g) * 0.5 + math.log(70)).exp().round().clamp(22, 200).long().tolist()
        lens = sorted(lens, key=lambda t: abs(t - sum(lens) / len(lens)))[:n]  # as above: closest to the mean
        tokens = [torch.cat([torch.ones(BATCH, 1, dtype=torch.long), torch.randint(4, vocab_size, (BATCH, t - 2), generator=g),
                             torch.full((BATCH, 1), 2)], 1) for t in lens]  # fmt: skip
        source = "synthetic ids (no Yahoo file), lognormal lengths"
    return [{"tokens": t, "lengths": torch.full((BATCH,), t.size(1))} for t in tokens], source


def train_direct(model, batches, warm, device, bf16) -> float:
    """Wall seconds of `train_steps` (tools/reference/speed.py's figure)."""
    return train_steps(model, batches, warm, device, bf16)[0]


def train_steps(model, batches, warm, device, bf16) -> tuple[float, float]:
    """SeqVAE.training_step without Lightning: loss_terms, zero_grad, backward, clip, 2 SGD steps;
    (wall, CPU) seconds of the steps after the first `warm`."""
    opts = model.train().configure_optimizers()
    for i, batch in enumerate(batches):
        if i == warm:
            start = stamp(device)
        with autocast(device, bf16):
            loss = model.loss_terms(batch, kl_weight=1.0)["loss"]
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), model.hparams.grad_clip)
        for opt in opts:
            opt.step()
    end = stamp(device)
    return end[0] - start[0], end[1] - start[1]


def module_step(model, batch, stepped, frozen, device, bf16):
    """One SGD update of `stepped` (encoder or decoder) as SeqVAE.update_step makes it, without
    Lightning; `frozen` modules get requires_grad False, i.e. no weight gradients."""
    params = [p for m in frozen for p in m.parameters()]
    for p in params:
        p.requires_grad_(False)
    with autocast(device, bf16):
        loss = model.loss_terms(batch, kl_weight=1.0)["loss"]
    model.zero_grad(set_to_none=True)
    loss.backward()
    for p in params:
        p.requires_grad_(True)
    torch.nn.utils.clip_grad_norm_([p for p in stepped.parameters() if p.grad is not None], model.hparams.grad_clip)
    with torch.no_grad():
        for p in stepped.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-model.hparams.lr)


def aggressive_bench(model, batches, warm, device, bf16) -> dict:
    """Seconds per step of the three updates of aggressive training (He et al. 2019): the inner
    encoder-only step as seqvae makes it (decoder weights frozen: no decoder weight gradients),
    the same step with a full backward (the reference: every gradient computed, the decoder's
    thrown away), and the outer decoder-only step. Same batches, interleaved per batch; `cpu_s`:
    the same in CPU seconds."""
    model.train()
    kinds = {
        "encoder_step": (model.encoder, [model.decoder]),
        "encoder_step_full_backward": (model.encoder, []),
        "decoder_step": (model.decoder, [model.encoder]),
    }
    seconds, cpu = dict.fromkeys(kinds, 0.0), dict.fromkeys(kinds, 0.0)
    for i, batch in enumerate(batches):
        for kind, (stepped, frozen) in kinds.items():
            start = stamp(device)
            module_step(model, batch, stepped, frozen, device, bf16)
            if i >= warm:
                end = stamp(device)
                seconds[kind], cpu[kind] = seconds[kind] + end[0] - start[0], cpu[kind] + end[1] - start[1]
    n = len(batches) - warm
    return {k: v / n for k, v in seconds.items()} | {"cpu_s": {k: v / n for k, v in cpu.items()}}


def profile(cfg, batches, device, bf16, n_samples, rows=12) -> None:
    """torch.profiler's top ops of training steps and of one IW-NLL decoder call, fused vs plain."""
    from torch.profiler import profile as torch_profile

    for fused in (True, False):
        model = SeqVAE(**cfg, fused_output=fused).to(device)
        train_direct(model, batches[:2], 1, device, bf16)  # one warm-up step, one timed
        with torch_profile() as prof:
            train_direct(model, batches[1:], 0, device, bf16)
        print(f"\n  profile of {len(batches) - 1} training steps, fused_output={fused}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))
        iw_bench(model, batches[0], 1, n_samples, device, bf16)  # warm-up
        with torch_profile() as prof:
            iw_bench(model, batches[0], 1, n_samples, device, bf16, warm_up=False)
        print(f"\n  profile of IW-NLL of one document, K={n_samples}, fused_output={fused}:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def iw_bench(model, batch, n_docs, n_samples, device, bf16, warm_up=True):
    """(wall seconds, samples per decoder call) of `iw_times` (tools/reference/speed.py's figure)."""
    wall, _, chunk = iw_times(model, batch, n_docs, n_samples, device, bf16, warm_up)
    return wall, chunk


def iw_times(model, batch, n_docs, n_samples, device, bf16, warm_up=True):
    """IW-NLL of n_docs equal-length documents at once, `iw_nll` called directly: (wall, CPU)
    seconds and the samples per decoder call; the warm-up is one decoder call of the timed shape."""
    tokens, lengths = batch["tokens"][:n_docs], batch["lengths"][:n_docs]
    model.eval()
    with torch.inference_mode(), autocast(device, bf16):
        chunk = model.iw_chunk(tokens)

        def run(k):
            mu, logvar, _ = model.encoder(tokens, lengths)
            return iw_nll(lambda z: model.decoder.log_likelihood(tokens, lengths, z), mu, logvar, k, chunk)

        if warm_up:
            run(min(chunk, n_samples))  # one decoder chunk
        start = stamp(device)
        run(n_samples)
        end = stamp(device)
        return end[0] - start[0], end[1] - start[1], chunk


def measure(spec: dict) -> dict:
    """One measurement, in a child process: `spec["part"]` of config `spec["config"]` with
    `fused_output=spec["fused"]`. Returns wall and CPU seconds and counts; the parent turns them
    into rates. The warm-up batches are the first timed ones again: the same shapes."""
    device, bf16, name, load = torch.device(spec["device"]), spec["bf16"], spec["config"], os.getloadavg()[0]
    tf32 = spec.get("tf32", True)
    if device.type == "cuda":  # as `seqvae fit/test` on CUDA (seqvae/training/precision.py); CPU untouched
        set_tf32(tf32)
    cfg = CONFIGS[name]
    warm, steps, n_docs, n_test = sizes(name, spec["quick"], device.type)
    batches, source = yahoo_batches(Path(spec["data"]), cfg["vocab_size"], steps)
    on_device = [{k: v.to(device) for k, v in b.items()} for b in batches[:warm] + batches]
    torch.manual_seed(0)
    model = SeqVAE(**cfg, fused_output=spec["fused"]).to(device)
    out = {"data": source, "lengths": [b["tokens"].size(1) for b in batches]}
    if spec["part"] == "train":
        out["seconds"], out["cpu_s"] = train_steps(model, on_device, warm, device, bf16)
    elif spec["part"] == "fit":  # the real training_step, through Trainer.fit
        r = out["fit"] = timed_fit(model, batches[:warm] + batches, warm, device, bf16, tf32)
        out["seconds"], out["cpu_s"] = r["wall_s"], r["cpu_s"]
    elif spec["part"] == "aggressive":
        out.update(aggressive_bench(model, on_device, warm, device, bf16))
    elif spec["part"] == "test":  # IW-NLL as `seqvae test` computes it, on batches of its size
        tested = batches[:n_test]
        r = out["test"] = timed_test(model, tested[:1] + tested, 1, device, spec["iw_samples"], bf16, tf32)
        out["seconds"], out["cpu_s"], out["lengths"] = r["wall_s"], r["cpu_s"], [b["tokens"].size(1) for b in tested]
    else:  # iw: `iw_nll` called directly on n_docs texts
        out["seconds"], out["cpu_s"], out["samples_per_decoder_call"] = iw_times(
            model, on_device[warm], n_docs, spec["iw_samples"], device, bf16
        )
        out["docs"], out["doc_length"] = n_docs, batches[0]["tokens"].size(1)
    out["memory"], out["tf32"], out["loadavg_1min"] = memory(device), tf32_state(device), [load, os.getloadavg()[0]]
    return out


ALLOCATORS = ("glibc default", "reuse_freed_memory")


def rusage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt


def allocator_bench(spec: dict) -> dict:
    """Training steps and IW-NLL under `spec["allocator"]`, applied (or not) by main() before any tensor."""

    def per_item(a, b, n):
        return {"wall_s": (b[0] - a[0]) / n, "user_s": (b[1] - a[1]) / n, "sys_s": (b[2] - a[2]) / n, "faults": (b[3] - a[3]) / n}

    torch.manual_seed(0)
    model = SeqVAE(**CONFIGS["small"]).eval()  # IW-NLL of the initial weights
    V, docs = CONFIGS["small"]["vocab_size"], spec["docs"]
    tokens, lengths = torch.randint(4, V, (docs, 80)), torch.full((docs,), 80)

    def iw():
        mu, logvar, _ = model.encoder(tokens, lengths)
        ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
        return iw_nll(ll, mu, logvar, spec["iw_samples"], model.iw_chunk(tokens))

    with torch.no_grad():
        iw()  # warm-up
        start = rusage()
        nll = iw()
    out = {"iw_doc": per_item(start, rusage(), docs)}
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # lr 1 on one repeated random batch diverges
    batch = {"tokens": torch.randint(4, V, (32, 80)), "lengths": torch.full((32,), 80)}
    warm = 3
    for i in range(warm + spec["steps"]):
        if i == warm:
            start = rusage()
        opt.zero_grad()
        loss = model.loss_terms(batch, 1.0)["loss"]
        loss.backward()
        opt.step()
    out["train_step"] = per_item(start, rusage(), spec["steps"])
    # The same numbers under both settings: the allocator changes where tensors live, not values.
    out["values"] = {"last_loss": float(loss), "iw_nll_sum": float(nll.sum())}
    return out


def allocator_main(args) -> None:
    print(f"{os.cpu_count()} CPU cores, 1-min load average {os.getloadavg()[0]:.2f}; {args.steps} training steps of "
          f"32 x 80 tokens, IW-NLL of {args.docs} texts with K = {args.iw_samples}; small config, 1 torch thread")  # fmt: skip
    for setting in ALLOCATORS:
        spec = {"part": "allocator", "allocator": setting, "steps": args.steps, "docs": args.docs, "iw_samples": args.iw_samples}
        r = run_child(spec, 1)
        for what in ("train_step", "iw_doc"):
            m = r[what]
            print(f"{setting:<20} {what:<11} {m['wall_s']:6.3f} s wall  {m['user_s']:6.3f} s user  "
                  f"{m['sys_s']:6.3f} s sys  {m['faults']:8.0f} minor faults")  # fmt: skip
        print(f"{setting:<20} last training loss {r['values']['last_loss']!r}, IW-NLL sum {r['values']['iw_nll_sum']!r}")
        note = "" if r["applied"] or setting == ALLOCATORS[0] else " (not applied: not glibc)"
        print(f"{setting:<20} max RSS {r['memory']['max_rss_mib']:.0f} MiB{note}")


def peak_child(spec: dict) -> dict:
    """The GEMM peak of `spec["shapes"]` in fp32 (and bf16 on a GPU that has it), with its printed lines."""
    device, lines = torch.device(spec["device"]), []
    if device.type == "cuda":  # the fp32 peak in the precision the measurements run in
        set_tf32(spec.get("tf32", True))
    dtypes = [torch.float32] + ([torch.bfloat16] if device.type == "cuda" and torch.cuda.is_bf16_supported() else [])
    peaks = {str(d).split(".")[1]: measure_peak(spec["shapes"], d, device, lines.append) for d in dtypes}
    return {"peaks": peaks, "lines": lines, "tf32": tf32_state(device)}


def run_child(spec: dict, threads: int | None) -> dict:
    """`measure(spec)` in a fresh interpreter (its own peak RSS)."""
    return child_results(spec, threads)[-1]


def child_results(spec: dict, threads: int | None) -> list[dict]:
    """The results `spec` printed in a fresh interpreter: one, or one per job of `spec["jobs"]`."""
    cmd = [sys.executable, "-m", "benchmarks.bench", "--child", json.dumps(spec)] + (["--threads", str(threads)] if threads else [])
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=path))
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"child {spec} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return [json.loads(line[len("RESULT ") :]) for line in lines]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="few steps and documents (a few minutes on one idle CPU core)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for training and IW")
    p.add_argument("--no-tf32", action="store_true", help="cuda: full fp32 matmuls and cuDNN (default: TF32, as seqvae fit)")
    p.add_argument("--iw-samples", type=int, default=500)
    p.add_argument("--data", type=Path, default=YAHOO, help="Yahoo text (synthetic ids if missing)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--paths", default="fused,plain", help="output-layer paths to measure, comma-separated")
    p.add_argument("--configs", default=",".join(CONFIGS), help="configs to measure, comma-separated (small, paper)")
    p.add_argument("--profile", action="store_true", help="only print profiles of the small config (fused and plain)")
    p.add_argument("--allocator", action="store_true", help="only compare glibc's default malloc with seqvae's setting")
    p.add_argument("--steps", type=int, default=10, help="--allocator: timed training steps")
    p.add_argument("--docs", type=int, default=4, help="--allocator: IW-NLL documents")
    p.add_argument("--child", help=argparse.SUPPRESS)  # internal: one measurement, JSON spec
    args = p.parse_args()
    spec = json.loads(args.child) if args.child else {}
    applied = False
    if spec.get("allocator") != ALLOCATORS[0]:
        applied = reuse_freed_memory()  # as the `seqvae` command does at start-up (seqvae/cli.py)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)  # no "GPU available: …" banner
    if args.child and spec.get("part") == "peak":
        return print("RESULT " + json.dumps(peak_child(spec)))
    if args.child:
        for job in spec.get("jobs", [{}]):  # jobs: several measurements in this one process (CUDA)
            one = {**spec, **job}
            r = allocator_bench(one) if one["part"] == "allocator" else measure(one)
            r.update(applied=applied, memory=memory(torch.device("cpu")) if one["part"] == "allocator" else r["memory"])
            print("RESULT " + json.dumps(r), flush=True)
        return
    if args.allocator:
        return allocator_main(args)
    device, threads, began = torch.device(args.device), torch.get_num_threads(), time.perf_counter()
    torch.manual_seed(0)
    res = {"command": " ".join(["python", "-m", "benchmarks.bench", *sys.argv[1:]]), "torch": torch.__version__,
           "lightning": pl.__version__, "device": args.device, "cpu_cores": os.cpu_count(), "torch_threads": threads,
           "bf16": args.bf16, "quick": args.quick, "iw_samples": args.iw_samples, "loadavg_start": os.getloadavg(),
           "allocator": "reuse_freed_memory", "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}  # fmt: skip
    print(f"torch {torch.__version__} on {res['gpu'] or args.device}, {os.cpu_count()} CPU cores, {threads} torch threads, "
          f"1-min load average {res['loadavg_start'][0]:.2f}{', bf16 autocast' if args.bf16 else ''}; "
          "glibc malloc with reuse_freed_memory() as `seqvae` runs; one child process per measurement "
          f"{'(on CUDA per config: its start-up once; peak RSS then of the whole child)' if device.type == 'cuda' else ''}")  # fmt: skip

    if args.profile:
        cfg = CONFIGS["small"]
        batches, source = yahoo_batches(args.data, cfg["vocab_size"], 4)
        print(f"small config {cfg}; {source}")
        profile(cfg, [{k: v.to(device) for k, v in b.items()} for b in batches], device, args.bf16, min(args.iw_samples, 165))
        return

    # ---- GEMM peak: the best of several shapes, the configs' own among them (best of reps each),
    # in a child too: its freed GEMM operands would stay in this process's heap (reuse_freed_memory)
    # and every later child's ru_maxrss starts from the RSS it was forked at.
    configs = {name: CONFIGS[name] for name in args.configs.split(",")}
    shapes = peak_shapes(configs, BATCH, {name: sizes(name, args.quick, device.type)[2] for name in configs}, device)
    res["gemm_shapes"] = {name: list(mkn) for name, mkn in shapes.items()}
    done = run_child({"part": "peak", "device": args.device, "shapes": res["gemm_shapes"], "tf32": not args.no_tf32}, args.threads)
    print("\n".join(done["lines"]))
    peaks, res["tf32"] = done["peaks"], done["tf32"]  # each measurement records its own too
    print(f"TF32: {res['tf32']}")
    res["gemm_gflops"] = {f"{kind} {name}": rate for kind, p in peaks.items() for name, rate in p["gflops"].items()}
    kind = "bfloat16" if args.bf16 and "bfloat16" in peaks else "float32"
    res["peak"] = {"dtype": kind, **{k: v for k, v in peaks[kind].items() if k != "gflops"}}
    peak = res["peak"]["gflops"] = peaks[kind]["peak_gflops"]

    def line(label, r, n, count, flops, unit="tokens", per="step", note=""):
        """Prints and returns one figure of child result `r` (n steps or texts): the wall rate, wall
        and CPU seconds per item, the load around it and the child's peak memory."""
        seconds, cpu, mem, load = r["seconds"], r["cpu_s"], r["memory"], r["loadavg_1min"]
        gflops = flops / seconds / 1e9
        against, text = rate_against_peak(gflops, peak)  # no fraction above 100%: a rate above the peak says so
        cuda = f", cuda {mem['cuda_max_allocated_mib']:.0f} MiB" if "cuda_max_allocated_mib" in mem else ""
        print(f"  {label:<34}{count / seconds:9.{0 if unit == 'tokens' else 3}f} {unit}/s {seconds / n:7.3f} s/{per} wall "
              f"{cpu / n:7.3f} CPU s/{per} {gflops:6.1f} GFLOP/s = {text} | load {load[0]:.1f}->{load[1]:.1f} | "
              f"peak RSS {mem['max_rss_mib']:5.0f} MiB{cuda}{note}")  # fmt: skip
        return {f"{unit}_per_s": count / seconds, f"s_per_{per}": seconds / n, f"cpu_s_per_{per}": cpu / n, "gflops": gflops,
                **against, "memory": mem}  # fmt: skip

    # ---- training and IW per config and output-layer path, each in its own process
    paths = {"fused": True, "plain": False}
    paths = {k: paths[k] for k in args.paths.split(",")}
    common = dict(device=args.device, bf16=args.bf16, quick=args.quick, data=str(args.data), iw_samples=args.iw_samples,
                  tf32=not args.no_tf32)  # fmt: skip
    K = args.iw_samples
    for name, cfg in configs.items():
        warm, steps, n_docs, n_test = sizes(name, args.quick, device.type)
        H, V = cfg["hidden_dim"], cfg["vocab_size"]
        out = res[name] = {"config": cfg, "warmup_steps": warm, "timed_steps": steps}
        print(f"\n[{name}] {cfg}: {steps} timed training steps of {BATCH} texts (+{warm} warm-up on the first timed "
              f"batches); IW-NLL K={K} of {n_docs} text(s) by iw_nll, of {n_test}x{BATCH} texts by Trainer.test "
              "(+1 warm-up batch of one decoder call)")  # fmt: skip
        slow = name == "paper" and args.quick and device.type == "cpu"  # paper on the CPU: minutes per step
        parts = ["train"] + ([] if slow else ["fit"]) + ["iw"] + (["test"] if name == "small" or device.type == "cuda" else [])
        parts += [] if slow else ["aggressive"]
        # fit and test: what `seqvae` runs, the default path
        jobs = [(part, path, fused) for part in parts for path, fused in paths.items() if fused or part not in ("fit", "test")]
        if device.type == "cuda":  # CUDA's start-up (~10 s) would dominate a child per measurement
            grouped = [{"part": part, "fused": fused} for part, _, fused in jobs]
            grouped = iter(child_results({**common, "config": name, "jobs": grouped}, args.threads))
        for part, path, fused in jobs:
            job_spec = {**common, "config": name, "part": part, "fused": fused}
            r = next(grouped) if device.type == "cuda" else run_child(job_spec, args.threads)
            out.setdefault(path, {})[part] = r
            if args.json:  # after every measurement: a run cut by a deadline keeps what it measured
                args.json.write_text(json.dumps(res, indent=2) + "\n")
            if "lengths" in r and "lengths" not in out:
                out["lengths"], res["data"] = r["lengths"], r["data"]
                tokens = sum(BATCH * (t - 1) for t in r["lengths"])
                flops = sum(3 * flops_fwd(cfg, BATCH, t) for t in r["lengths"])
                out.update(train_flops_per_token=flops / tokens, output_layer_flop_share=80 * 2 * H * V / flops_fwd(cfg, 1, 81),
                           recurrent_flop_share=(81 + 80) * 8 * H * H / flops_fwd(cfg, 1, 81))  # fmt: skip
                print(f"  T={out['lengths'][:4]}{'…' if steps > 4 else ''}; {res['data']}; analytic training FLOPs per "
                      f"predicted token {flops / tokens / 1e6:.1f} M (at T=81: output layer {out['output_layer_flop_share']:.0%}, "
                      f"recurrent h·W_hh {out['recurrent_flop_share']:.0%})")  # fmt: skip
            if part == "train":
                r.update(line(f"train, {path}, direct loop", r, steps, tokens, flops))
            elif part == "fit":
                r.update(line(f"train, {path}, Trainer.fit", r, r["fit"]["steps"], tokens, flops))
                if "train" in out[path]:  # the same batches, the same model: what the real step adds
                    direct = out[path]["train"]
                    out["trainer_overhead"] = {
                        "cpu_s_per_step": r["cpu_s_per_step"] - direct["cpu_s_per_step"],
                        "cpu_ratio": r["cpu_s_per_step"] / direct["cpu_s_per_step"],
                    }  # fmt: skip
                    print(f"  Trainer.fit vs the direct loop: {out['trainer_overhead']['cpu_s_per_step'] * 1e3:+.1f} ms CPU "
                          f"per step ({out['trainer_overhead']['cpu_ratio']:.2f}x the direct loop's CPU time)")  # fmt: skip
            elif part == "iw":
                T = r["doc_length"]
                iw_flops = n_docs * flops_fwd(cfg, 1, T, K, encoder_once=True)
                note = f"; {r['samples_per_decoder_call']} samples per decoder call"
                r.update(line(f"IW-NLL K={K}, {path}, iw_nll", r, n_docs, n_docs, iw_flops, "docs", "doc", note))
            elif part == "test":
                t = r["test"]
                iw_flops = sum(BATCH * flops_fwd(cfg, 1, T, K, encoder_once=True) for T in r["lengths"])
                note = f"; T={r['lengths']}, {t['samples_per_decoder_call']} samples per decoder call"
                label = f"IW-NLL K={K}, {path}, Trainer.test"
                r.update(line(label, r, t["texts"], t["texts"], iw_flops, "texts", "text", note))
            else:
                # The window rule stops after 30 inner steps at the earliest, so 30 is the
                # cheapest decoder update aggressive training makes.
                r["s_per_decoder_update_30"] = 30 * r["encoder_step"] + r["decoder_step"]
                c = r["cpu_s"]
                print(f"  aggressive, {path:<16}inner encoder step {r['encoder_step']:.3f} s ({c['encoder_step']:.3f} CPU s; "
                      f"full backward {r['encoder_step_full_backward']:.3f} s), decoder step {r['decoder_step']:.3f} s; per decoder "
                      f"update at 30 inner steps {r['s_per_decoder_update_30']:.2f} s | peak RSS {r['memory']['max_rss_mib']:.0f} MiB")  # fmt: skip
        if "test" not in parts:
            print(f"  IW-NLL through Trainer.test: not measured on the CPU at this size ({BATCH} texts x K={K} per batch)")
        if "fused" in out and "plain" in out:
            out["fused_speedup"] = {k: out["plain"][k]["seconds"] / out["fused"][k]["seconds"] for k in ("train", "iw")}
            print(
                f"  fused vs plain: training {out['fused_speedup']['train']:.2f}x, IW-NLL {out['fused_speedup']['iw']:.2f}x faster"
            )

    res["loadavg_end"], res["wall_s"] = os.getloadavg(), time.perf_counter() - began
    print(
        f"\ntotal {res['wall_s']:.0f} s; 1-min load average at end {res['loadavg_end'][0]:.2f} "
        "(other processes on the machine lower every wall figure: read them as lower bounds; CPU seconds much less)"
    )
    if args.json:
        args.json.write_text(json.dumps(res, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
