"""Checks that qualify a run's numbers, measured at every validation (not the sanity check) and
every test: one class each (`EvalCheck`). A model brings the checks that apply to it
(`SeqVAE.configure_callbacks`: BN-VAE's `bn_bound.BNBoundCheck`, and those its posterior
declares in `Posterior.checks`, e.g. WAE-RNF's `rnf_bn_check.RNFHeadsCheck`). A check stores its
record under its `key` in the model's `checks` (saved in checkpoints, so a test of the best
checkpoint starts from that epoch's record and replaces it with its own: the test's is the one
metrics.json keeps) and prints one `seqvae: warning:` line when the record says broken.

The record describes itself (`title`, `consequence`): `seqvae compare`, which reads runs without
torch, marks with † the posterior metrics (metric_spec's `bn_sensitive`) of runs whose record is
broken and writes the footnote from those two fields, so a new check needs no entry elsewhere.

Not every validation repeats the warning: a broken state tends to stay, and the same line every
epoch would bury the rest of the log. A validation warns when the record's `dims` differ from
those of the last validation warning (a first break, more or other dimensions; a recovery resets
it); a test pass always says it, once: its numbers are the run's."""

from __future__ import annotations

import math
import sys
from typing import ClassVar

import torch
from pytorch_lightning import Callback

PREFIX = "seqvae: warning: "


class RawMoments:
    """A forward pre-hook on a BatchNorm1d: per-dimension float64 sums of the inputs it sees in
    eval mode, shifted by its running mean (no cancellation when they barely vary). The shift is
    read at the first eval-mode call, not before: under DDP each rank's running statistics differ
    after its last training batch until the wrapper broadcasts rank 0's buffers at the first
    evaluation forward, and the sums of all ranks must share one shift."""

    def __init__(self, bn: torch.nn.BatchNorm1d):
        self.bn, self.shift = bn, None
        z = bn.running_mean.numel()
        self.sums = torch.zeros(1 + 2 * z, dtype=torch.float64, device=bn.running_mean.device)  # n, Σ(x-c), Σ(x-c)²

    def __call__(self, module, args) -> None:
        if module.training:
            return
        if self.shift is None:
            self.shift = module.running_mean.detach().double().clone()
        x = args[0].detach().double() - self.shift
        z = self.shift.numel()
        self.sums[0] += x.size(0)
        self.sums[1 : 1 + z] += x.sum(0)
        self.sums[1 + z :] += (x * x).sum(0)

    def mean_var(self, trainer) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(texts, mean, variance with divisor n-1) over every rank's texts."""
        sums = self.sums
        if trainer.world_size > 1:
            sums = trainer.strategy.reduce(sums.clone(), reduce_op="sum")
        shift = self.shift if self.shift is not None else self.bn.running_mean.detach().double()  # a rank that saw no text
        z = shift.numel()
        n, s, ss = int(sums[0].item()), sums[1 : 1 + z], sums[1 + z :]
        if n < 2:
            return n, s, torch.full_like(s, math.nan)
        return n, s / n + shift, (ss - s * s / n) / (n - 1)


def number(x: float) -> float | None:
    """A JSON-safe float (metrics.json is written with allow_nan=False)."""
    return float(x) if math.isfinite(x) else None


class EvalCheck(Callback):
    """One check (see the module's docstring). A subclass says its metrics.json `key`, whether it
    `applies` to a model, which BatchNorm layers it watches (`norms`: their eval-mode inputs are
    collected by `RawMoments`), the `record` it makes of them, and its `warning_line`. A record
    holds at least `broken`, `dims` (what the warn-once rule compares), `title` and `consequence`
    (compare's footnote: "† {title} in runs …: see metrics.json {key}; {consequence}")."""

    key: ClassVar[str]

    def __init__(self):
        self._moments: dict[str, RawMoments] = {}
        self._handles: list = []
        self._warned: dict[str, object] = {}

    @staticmethod
    def applies(model) -> bool:
        raise NotImplementedError

    def norms(self, pl_module) -> dict[str, torch.nn.BatchNorm1d]:
        raise NotImplementedError

    def record(self, trainer, pl_module, moments: dict[str, tuple[int, torch.Tensor, torch.Tensor]], stage: str) -> dict | None:
        """The record from each watched norm's (texts, mean, variance) over the pass; None: nothing to say."""
        raise NotImplementedError

    def warning_line(self, record: dict) -> str:
        raise NotImplementedError

    @staticmethod
    def where(record: dict) -> str:
        return "test" if record["stage"] == "test" else f"validation (epoch {record['epoch'] + 1})"

    def _start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not self.applies(pl_module):
            return
        for name, bn in self.norms(pl_module).items():
            self._moments[name] = RawMoments(bn)
            self._handles.append(bn.register_forward_pre_hook(self._moments[name]))

    def on_validation_epoch_start(self, trainer, pl_module):
        self._start(trainer, pl_module)

    def on_test_epoch_start(self, trainer, pl_module):
        self._start(trainer, pl_module)

    def _end(self, trainer, pl_module, stage: str) -> None:
        if not self._handles:
            return
        for handle in self._handles:
            handle.remove()
        moments, self._moments, self._handles = self._moments, {}, []
        measured = {name: m.mean_var(trainer) for name, m in moments.items()}
        if any(n < 2 for n, _, _ in measured.values()):
            return
        record = self.record(trainer, pl_module, measured, stage)
        if record is None:
            return
        pl_module.checks[self.key] = record
        if not record["broken"]:
            self._warned.pop(stage, None)
            return
        if stage == "val" and self._warned.get(stage) == record["dims"]:
            return
        self._warned[stage] = record["dims"]
        if trainer.is_global_zero:
            print(self.warning_line(record), file=sys.stderr)

    def on_validation_epoch_end(self, trainer, pl_module):
        self._end(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer, pl_module):
        self._end(trainer, pl_module, "test")
