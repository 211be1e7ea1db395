"""What `seqvae fit` and `seqvae test` run, timed through a `pl.Trainer` (issue 46 item 6).

`timed_fit`: training steps through `Trainer.fit` with the model's own `training_step` untouched:
its optimisers, clipping, finite check, logging (a TensorBoard logger, as `seqvae fit` has, at
Lightning's default interval), `MatmulPrecision` (TF32 on CUDA, as the CLI adds it) and the
batch's copy to the device by Lightning (batches are given on the CPU, as a DataLoader gives them).
`timed_test`: IW-NLL as `seqvae test` computes it: `Trainer.test`, the model's `test_step` on
batches of the test's size, K importance samples in decoder calls of `model.iw_chunk` samples.

Both are timed by `BatchClock`, a callback: from the end of the last warm-up batch to the end of
the last batch, so the timed span holds exactly the timed batches' loop iterations (fetch, copy,
step, hooks) and nothing else; on CUDA it synchronises at those two points only (a sync per step
would add reads the real loop does not make). Each span has wall and CPU seconds of this process
(`time.process_time`: user + system, all threads): on a machine shared with other work the wall
time grows with the load, the CPU time much less.

The warm-up batches have the timed batches' shapes (the caller passes the first timed batches
again), so cuDNN/cuBLAS plans and the caching allocator are warm for the shapes being timed; in
`timed_test` a warm-up batch decodes one decoder call of the timed size (K = the chunk) instead
of all K samples.
"""

from __future__ import annotations

import tempfile
import time

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import TensorBoardLogger

from seqvae.training.precision import MatmulPrecision


def stamp(device: torch.device) -> tuple[float, float]:
    """(wall, CPU seconds of this process) once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter(), time.process_time()


class BatchClock(pl.Callback):
    """Stamps the end of batch `warm - 1` and of batch `last` of a fit's or a test's loop, and
    counts the batches each loop started (`started`) and the timed ones among them (`timed`)."""

    def __init__(self, warm: int, last: int, device: torch.device):
        if not 1 <= warm <= last:
            raise ValueError(f"warm-up batches {warm}: at least 1 and fewer than the {last + 1} batches")
        self.warm, self.last, self.device = warm, last, device
        self.started = self.timed = 0
        self.start = self.end = None

    def _started(self, batch_idx: int) -> None:
        self.started += 1
        self.timed += batch_idx >= self.warm

    def _ended(self, batch_idx: int) -> None:
        if batch_idx == self.warm - 1:
            self.start = stamp(self.device)
        elif batch_idx == self.last:
            self.end = stamp(self.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._started(batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._ended(batch_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._started(batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._ended(batch_idx)

    def seconds(self) -> tuple[float, float]:
        """(wall, CPU) seconds of the timed batches together."""
        return self.end[0] - self.start[0], self.end[1] - self.start[1]


class WarmUpDecoderCall(pl.Callback):
    """`test_iw_samples` per test batch: one decoder call's worth (the chunk `iw_chunk` gives the
    batch) for the first `warm` batches, `n_samples` for the rest; the chunk is recorded."""

    def __init__(self, warm: int, n_samples: int):
        self.warm, self.n_samples, self.chunks = warm, n_samples, []

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        chunk = pl_module.iw_chunk(batch["tokens"])  # as evaluate_batch sizes its decoder calls
        self.chunks.append(chunk)
        pl_module.hparams.test_iw_samples = min(chunk, self.n_samples) if batch_idx < self.warm else self.n_samples


def make_trainer(device: torch.device, bf16: bool, tf32: bool, callbacks: list, logs: str | None = None, **limits) -> pl.Trainer:
    """A Trainer as the CLI builds one for `device`, without run directory, checkpoints or progress bar."""
    return pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_epochs=1, num_sanity_val_steps=0,
        precision="bf16-mixed" if bf16 else "32-true", logger=TensorBoardLogger(logs, name="bench") if logs else False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[MatmulPrecision(tf32), *callbacks], **limits,
    )  # fmt: skip


def loader(batches: list[dict], indexed: bool = False) -> torch.utils.data.DataLoader:
    """`batches` on the CPU, as a DataLoader gives them; `indexed`: with the texts' dataset positions
    (`index`), as the test's per-text rows need them."""
    batches, first = [{k: v.cpu() for k, v in b.items()} for b in batches], 0
    for b in batches if indexed else []:
        n = b["tokens"].size(0)
        b["index"], first = torch.arange(first, first + n), first + n
    return torch.utils.data.DataLoader(batches, batch_size=None)


def timed_fit(model, batches: list[dict], warm: int, device: torch.device, bf16: bool = False, tf32: bool = True) -> dict:
    """The training steps on `batches[warm:]` after `warm` untimed ones, through `Trainer.fit`."""
    clock = BatchClock(warm, len(batches) - 1, device)
    with tempfile.TemporaryDirectory() as logs:
        fit = make_trainer(device, bf16, tf32, [clock], logs, limit_train_batches=len(batches), limit_val_batches=0)
        fit.fit(model, train_dataloaders=loader(batches, indexed=True))
    wall, cpu = clock.seconds()
    return {"steps": clock.timed, "batches_run": clock.started, "wall_s": wall, "cpu_s": cpu,
            "s_per_step": wall / clock.timed, "cpu_s_per_step": cpu / clock.timed}  # fmt: skip


def timed_test(
    model, batches: list[dict], warm: int, device: torch.device, n_samples: int, bf16: bool = False, tf32: bool = True
) -> dict:
    """IW-NLL with K = `n_samples` of the texts of `batches[warm:]` through `Trainer.test`, after
    `warm` batches of one decoder call each."""
    clock, samples = BatchClock(warm, len(batches) - 1, device), WarmUpDecoderCall(warm, n_samples)
    kept = model.hparams.test_iw_samples
    try:
        test = make_trainer(device, bf16, tf32, [samples, clock], limit_test_batches=len(batches))
        test.test(model, dataloaders=loader(batches, indexed=True), verbose=False)
    finally:
        model.hparams.test_iw_samples = kept
    wall, cpu = clock.seconds()
    texts = sum(b["tokens"].size(0) for b in batches[warm:])
    return {"texts": texts, "batches": clock.timed, "batches_run": clock.started, "K": n_samples,
            "samples_per_decoder_call": samples.chunks[warm:], "wall_s": wall, "cpu_s": cpu,
            "s_per_text": wall / texts, "cpu_s_per_text": cpu / texts}  # fmt: skip
