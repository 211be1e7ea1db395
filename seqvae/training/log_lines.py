"""What a run prints in a log, where a progress bar would be noise (the CLI adds these when
stderr is not a terminal: logs, CI, sweep cells): one line per training epoch, and a line at
every tenth of a long test."""

from __future__ import annotations

import sys
import time

from pytorch_lightning import Callback

from seqvae.clock import clock
from seqvae.text.corpus import IndexedTexts


class EpochMean:
    """Σ value·n / Σ n over the batches of one training epoch (the per-text train/loss of the
    epoch line). The model adds to it in training_step and keeps it in its checkpoints, so an
    epoch resumed mid-way still averages the batches from before the interruption."""

    def __init__(self):
        self.epoch, self.total, self.count = -1, 0.0, 0

    def add(self, epoch: int, value, n: int) -> None:
        """`value`: a float, or an fp64 device tensor (summed on the device, read in `mean`: the
        same fp64 sums as the floats', with no host read per batch)."""
        if epoch != self.epoch:  # a new epoch starts a new mean
            self.epoch, self.total, self.count = epoch, 0.0, 0
        self.total = self.total + value * n
        self.count += n

    def mean(self, epoch: int) -> float | None:
        return float(self.total) / self.count if epoch == self.epoch and self.count else None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "total": float(self.total), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.total, self.count = state["epoch"], state["total"], state["count"]


class EpochLine(Callback):
    """One line per training epoch on stderr, for logs, CI and sweeps' cell logs, where a progress
    bar would be noise (the CLI adds it when stderr is not a terminal; in a terminal Lightning's
    progress bar shows the same values):

        seqvae: epoch 3/20  train/loss 201.30  val/loss 199.84  val/kl 0.01  val/mi 0.03  val/au 0  kl_weight 0.46  42 s

    `train/loss` is the epoch's mean per text (each batch's loss weighted by its number of texts,
    the model's `train_loss_mean`; rank 0's batches under DDP), not the last batch's value that
    Lightning keeps: with length buckets one batch's loss swings by hundreds of nats, and it read
    as the epoch's. The seconds are those since this process started the epoch.
    """

    KEYS = ("train/loss", "val/loss", "val/rec", "val/kl", "val/mi", "val/au", "val/iw_nll", "train/kl_weight")

    def __init__(self):
        self._start = time.monotonic()

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = time.monotonic()

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or trainer.state.fn != "fit" or not trainer.is_global_zero:
            return
        values = dict(trainer.callback_metrics)
        epoch_mean = getattr(pl_module, "train_loss_mean", None)
        mean = epoch_mean.mean(trainer.current_epoch) if epoch_mean is not None else None
        if mean is not None:
            values["train/loss"] = mean
        shown = [(k, float(values[k]), 0 if k == "val/au" else 2) for k in self.KEYS if k in values]
        shown = [(k if k == "train/loss" else k.removeprefix("train/"), v, d) for k, v, d in shown]
        parts = [f"{name} {v:.{digits}f}" for name, v, digits in shown]
        of = f"/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        seconds = time.monotonic() - self._start
        print(f"seqvae: epoch {trainer.current_epoch + 1}{of}  {'  '.join(parts)}  {seconds:.0f} s", file=sys.stderr)


class TestProgress(Callback):
    """A line on stderr at every tenth of a test's work, once it has run `quiet_seconds` (a short
    test prints nothing): a 10,000-text test with K = 500 runs for hours on a CPU.

        seqvae: test 40% (612/1000 texts)  20:05 elapsed  ~30:07 left

    Work is counted as each batch's padded tokens (texts × longest text) times the decoder passes
    they take, the K importance samples of the IW-NLL and the one of the reconstruction term
    (`model.hparams.test_iw_samples`): not texts or batches, since evaluation batches come in
    length order, so the last tenth of the texts is far more than a tenth of the time. "left"
    extrapolates the work done so far.

    With AIS (`model.ais`) a text costs `ais.passes_per_text()` passes more, and the model calls
    `ais_progress(share)` after each AIS transition, so that a batch that runs for an hour still
    moves the line.

    Lines are at least `min_interval` seconds apart: a tenth crossed sooner than that after the
    previous line (the first line comes when the quiet time ends, whatever the share, and the
    next tenth may follow a second later) is skipped, and the next line waits for the next tenth.
    """

    def __init__(self, quiet_seconds: float = 30.0, min_interval: float = 10.0):
        self.quiet_seconds, self.min_interval = quiet_seconds, min_interval
        self._total = self._done = self._texts = self._total_texts = 0
        self._passes, self._batch = 1, 0
        self._start, self._next, self._last = time.monotonic(), 0.1, None

    @staticmethod
    def passes(pl_module) -> int:
        """Decoder passes over each text at test: K importance samples and the reconstruction term's
        one, and AIS's (`model.ais`)."""
        hparams = getattr(pl_module, "hparams", None)
        k = getattr(hparams, "test_iw_samples", None) if hparams is not None else None
        ais = getattr(pl_module, "ais", None)
        return 1 + (k if isinstance(k, int) and k > 0 else 0) + (ais.passes_per_text() if ais is not None else 0)

    def work(self, texts: int, longest: int) -> int:
        """A batch's work: its padded tokens times the decoder passes over them."""
        return texts * longest * self._passes

    def on_test_epoch_start(self, trainer, pl_module):
        loaders = trainer.test_dataloaders
        loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
        sampler, data = getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)
        batches = list(sampler) if sampler is not None and isinstance(data, IndexedTexts) else []
        in_file = sum(len(b) for b in batches)
        limit = (getattr(trainer, "num_test_batches", None) or [len(batches)])[0]
        batches = batches[: int(limit)] if limit != float("inf") else batches  # trainer.limit_test_batches
        self._passes = self.passes(pl_module)
        self._total = sum(self.work(len(b), max(len(data.ids[i]) for i in b)) for b in batches if b)
        self._total_texts = sum(len(b) for b in batches)
        self._done = self._texts = 0
        self._start, self._next, self._last = time.monotonic(), 0.1, None
        ais = getattr(pl_module, "ais", None)
        if trainer.is_global_zero and self._total_texts:  # K is an evaluation setting, not the run's: say which
            k = self._passes - 1 - (ais.passes_per_text() if ais is not None else 0)
            iw = f"IW-NLL with K = {k} importance samples per text" if k else "no IW-NLL (model.test_iw_samples 0)"
            if ais is not None:
                iw += f"; AIS with {ais.chains} chains, {ais.points} points, {ais.gradient_evaluations()} gradients per text"
            texts = f"{self._total_texts} texts"
            if self._total_texts != in_file:
                texts = f"{self._total_texts} of {in_file} texts (trainer.limit_test_batches {trainer.limit_test_batches})"
            print(f"seqvae: test: {texts}, {iw}", file=sys.stderr)
        if ais is not None and trainer.is_global_zero:
            pl_module.ais_progress = self.within_batch

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        texts, longest = batch["tokens"].shape
        self._batch = self.work(int(texts), int(longest))

    def within_batch(self, share: float) -> None:
        """AIS's share of the batch done: the line moves within a long batch (texts counted at its end)."""
        if self._total:
            self._report(self._done + share * self._batch, time.monotonic())

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not self._total or not trainer.is_global_zero:
            return
        texts, longest = batch["tokens"].shape
        self._done += self.work(int(texts), int(longest))
        self._texts += int(texts)
        self._report(self._done, time.monotonic())

    def _report(self, done: float, now: float) -> None:
        share, seconds = done / self._total, now - self._start
        if share < self._next or share >= 1 or seconds < self.quiet_seconds:
            return
        self._next = int(share * 10 + 1) / 10  # this tenth is done with, printed or not
        if self._last is not None and now - self._last < self.min_interval:
            return
        self._last = now
        left = seconds * (1 - share) / share
        print(
            f"seqvae: test {int(share * 100)}% ({self._texts}/{self._total_texts} texts)  "
            f"{clock(seconds)} elapsed  ~{clock(left)} left",
            file=sys.stderr,
        )
