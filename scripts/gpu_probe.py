"""The first GPU session's probe (scripts/gpu_session.sh, step 2): one process, so CUDA starts once.

    python scripts/gpu_probe.py --device cuda --data .gpu/yahoo/valid.txt --json $OUT/probe.json [--deadline S]
    python scripts/gpu_probe.py --device cpu --smoke ...   # the CPU dry run: same code, toy sizes

Figures, in this order, the JSON rewritten after each one (a deadline keeps what was measured):
  1. training tokens/s through a real `pl.Trainer` (the model's own training_step: its host reads,
     logging and checks included) at the paper's size (emb 512, LSTM 1024, V = 20k, B = 32), in
     "default" (torch's own: fp32 matmuls, cuDNN's TF32 LSTM), "tf32" (fp32 matmuls in TF32:
     what `seqvae fit` uses on CUDA) and "bf16" (bf16-mixed); then "tf32" with the output layer's
     training chunk = the whole batch (issue 46 item 5). Warm-up steps at the measured length are
     left out of the timing; each figure has its peak CUDA memory and its host reads per step
     (Tensor.item/__bool__/__float__/__int__/tolist/nonzero calls, and on CUDA the syncs that
     `torch.cuda.set_sync_debug_mode` reports). The three at the device's chunking
     (`core/chunking.py`: on CUDA one chunk per batch, padding weighted), then "tf32" at today's
     (the CPU's: 256-row chunks, real tokens selected by a boolean mask).
  2. IW-NLL seconds per text at K = 500 on one 32-text batch, as `seqvae test` computes it
     (`evaluate_batch`'s `iw_log_weights`), in TF32: at today's chunking (a 64th of the free
     memory as IW budget, 800-row evaluation chunks), at the device's (`core/chunking.py`), and
     with all K samples in one decoder call.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytorch_lightning as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: benchmarks/
from benchmarks.bench import yahoo_batches  # noqa: E402
from seqvae.core import chunking  # noqa: E402
from seqvae.core.metrics import iw_log_weights, iw_nll_from_weights  # noqa: E402
from seqvae.core.model import SeqVAE  # noqa: E402

PAPER = dict(embed_dim=512, hidden_dim=1024, latent_dim=32, vocab_size=20000)
SMOKE = dict(embed_dim=16, hidden_dim=16, latent_dim=4, vocab_size=500)
HOST_READS = ("item", "__bool__", "__float__", "__int__", "tolist", "nonzero")


class HostReads:
    """Counts reads of tensor values by the host while active: the Python-level ones on any
    device, and on CUDA every synchronising call torch's sync debug mode reports."""

    def __init__(self, device: torch.device):
        self.device, self.count, self._saved = device, 0, {}

    def __enter__(self):
        for name in HOST_READS:
            real = self._saved[name] = getattr(torch.Tensor, name)

            def counted(t, *a, _real=real, **k):
                self.count += 1
                return _real(t, *a, **k)

            setattr(torch.Tensor, name, counted)
        if self.device.type == "cuda":
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        for name, real in self._saved.items():
            setattr(torch.Tensor, name, real)
        if self.device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
            self.count += sum("synchroniz" in str(w.message) for w in self._caught)
            self._warnings.__exit__(*exc)


def matmul_mode(mode: str) -> None:
    """torch's global fp32 settings for one figure ("bf16" keeps TF32 for what autocast leaves fp32)."""
    torch.set_float32_matmul_precision("highest" if mode == "default" else "high")
    torch.backends.cudnn.allow_tf32 = True  # torch's default, in every mode


def sync(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


@contextlib.contextmanager
def chunked(plan):
    """`plan` (a chunking.Chunking) for every device while active; None: the device's own."""
    real = chunking.chunking_for
    if plan is not None:
        chunking.chunking_for = lambda device_type: plan
    try:
        yield
    finally:
        chunking.chunking_for = real


def train_figure(cfg, batches, warm, device, mode, plan=None) -> dict:
    """Tokens/s of `len(batches) - warm` training steps through a real Trainer."""
    matmul_mode(mode)
    torch.manual_seed(0)
    model = SeqVAE(**cfg)
    marks, reads = {}, HostReads(device)

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if batch_idx == warm:
                marks["start"] = sync(device)
                reads.__enter__()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == len(batches) - 1:
                reads.__exit__(None, None, None)
                marks["end"] = sync(device)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_epochs=1,
        limit_train_batches=len(batches), limit_val_batches=0, num_sanity_val_steps=0,
        precision="bf16-mixed" if mode == "bf16" else "32-true", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[Clock()],
    )  # fmt: skip
    with chunked(plan):
        trainer.fit(model, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    steps = len(batches) - warm
    tokens = sum(b["tokens"].size(0) * (b["tokens"].size(1) - 1) for b in batches[warm:])
    seconds = marks["end"] - marks["start"]
    out = {"mode": mode, "steps": steps, "warmup_steps": warm, "tokens_per_s": tokens / seconds,
           "s_per_step": seconds / steps, "host_reads_per_step": reads.count / steps,
           "chunking": "today's (CPU)" if plan is chunking.CPU else "device's"}  # fmt: skip
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def iw_figure(cfg, batch, device, k, budget, plan, label) -> dict:
    """IW-NLL s/text of one batch at K = k, with the IW budget `budget` (None: the device's) and
    the chunking `plan` (None: the device's); TF32."""
    matmul_mode("tf32")
    torch.manual_seed(0)
    model = SeqVAE(**cfg, iw_max_elements=None if budget == "today" else budget).to(device).eval()
    tokens, lengths = batch["tokens"].to(device), batch["lengths"].to(device)
    if budget == "today":  # iw_chunk's CUDA default before issue 46: a 64th of the free memory
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
        model.hparams.iw_max_elements = max(2**26, free // 64)
    with chunked(plan):
        with torch.inference_mode():
            chunk = model.iw_chunk(tokens)

            def run(n):
                mu, logvar, _ = model.encoder(tokens, lengths)
                ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
                return iw_nll_from_weights(iw_log_weights(ll, mu, logvar, n, chunk, torch.Generator(device=device).manual_seed(0)))

            run(min(chunk, k))  # warm-up: one decoder call of the measured shape
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            start = sync(device)
            nll = run(k)
            seconds = sync(device) - start
    out = {"chunking": label, "K": k, "texts": tokens.size(0), "T": tokens.size(1), "samples_per_decoder_call": chunk,
           "s_per_text": seconds / tokens.size(0), "mean_iw_nll": float(nll.mean())}  # fmt: skip
    if device.type == "cuda":
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--data", type=Path, required=True, help="the Yahoo text (the carried .gpu/yahoo/valid.txt)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--smoke", action="store_true", help="toy sizes (the CPU dry run)")
    p.add_argument("--deadline", type=float, default=150.0, help="seconds: no figure is started after this")
    args = p.parse_args(argv)
    began = time.perf_counter()
    warnings.filterwarnings("ignore", module="pytorch_lightning")
    device = torch.device(args.device)
    cfg = SMOKE if args.smoke else PAPER
    warm, steps, k = (1, 2, 5) if args.smoke else (5, 30, 500)
    batches, source = yahoo_batches(args.data, cfg["vocab_size"], warm + steps)
    res = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "cuda": torch.version.cuda, "config": cfg, "data": source, "batch_lengths": [b["tokens"].size(1) for b in batches],
           "train": [], "iw": []}  # fmt: skip

    def save(note):
        res["elapsed_s"] = round(time.perf_counter() - began, 1)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
        print(f"[gpu_probe {res['elapsed_s']:.0f}s] {note}", flush=True)

    save(f"{res['device']}: {source}")
    on_device = [{k_: v.to(device) for k_, v in b.items()} for b in batches]
    # (part, what the figure is, how to measure it): a figure that fails is recorded with its error
    # and the next one runs (one failing mode must not cost the session the others' figures)
    modes = ("default", "tf32", "bf16")
    figures = [("train", {"mode": m}, lambda m=m: train_figure(cfg, on_device, warm, device, m)) for m in modes]
    today = lambda: train_figure(cfg, on_device, warm, device, "tf32", plan=chunking.CPU)  # noqa: E731
    figures.append(("train", {"mode": "tf32"}, today))
    batch = batches[len(batches) // 2]
    whole_k = batch["tokens"].numel() * cfg["vocab_size"] * k  # every sample in one decoder call
    for budget, plan, name in (("today", chunking.CPU, "today's (CPU)"), (None, None, "device's"),
                               (whole_k, None, "device's, all K in one call")):  # fmt: skip
        figures.append(("iw", {"K": k}, lambda b=budget, p=plan, n=name: iw_figure(cfg, batch, device, k, b, p, n)))
    for part, label, figure in figures:
        if time.perf_counter() - began > args.deadline:
            save(f"deadline {args.deadline:.0f} s reached: the remaining figures were not measured")
            break
        try:
            r = figure()
        except torch.cuda.OutOfMemoryError as err:
            r = {**label, "error": f"out of memory: {str(err).splitlines()[0]}"}
            torch.cuda.empty_cache()
        except Exception as err:  # recorded, with its traceback in the log
            traceback.print_exc()
            r = {**label, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        res[part].append(r)
        save(f"{part}: " + json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
