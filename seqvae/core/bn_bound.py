"""BN-VAE's bound, checked at every validation and test (`BNBoundCheck`, a callback SeqVAE brings).

BN-VAE batch-normalises the posterior means with a fixed scale γ: with v the batch variance of
the raw (pre-BN) means of a dimension, E_batch[mu_d²] = γ²·v/(v+ε) + β_d², so E[KL] ≥ Z·γ²/2 only
while v ≫ ε (`networks.LSTMEncoder`). An encoder can escape the bound by making its raw means
nearly constant; then evaluation, which divides by the running variance + ε, no longer maps the
means to a spread of γ either, and a small drift of their mean from the running mean puts every
text's mean several prior standard deviations off: a KL of hundreds of nats, a huge IW-NLL, and
AU = Z, which reads as an encoder that encodes. The check measures, per latent dimension, the
variance of the raw means over the evaluation texts and BatchNorm's running variance (the
training batches' variance), and calls the bound broken where either is below THRESHOLD·ε.

THRESHOLD = 10: at v = 10·ε the bound keeps γ²·10/11 ≈ 91% of its value and eval-mode BatchNorm
divides by √(v+ε) ≈ 1.05·√v, i.e. both still do what BN-VAE claims to within 10%; at v = ε half
of the bound is gone, and below it fades as v/ε. A healthy encoder's raw means vary by far more
(the demo config after 2 epochs: variance ≥ 0.03 in every dimension), so the margin costs no
false alarms.
"""

from __future__ import annotations

import math
import sys

import torch
from pytorch_lightning import Callback

THRESHOLD = 10.0  # the bound counts as broken where a variance is below THRESHOLD·ε (see above)
SHOWN_DIMS = 8  # indices the warning line names (metrics.json lists all)
PREFIX = "seqvae: warning: "


def mean_norm(pl_module) -> torch.nn.BatchNorm1d | None:
    encoder = getattr(pl_module, "encoder", None)
    return getattr(encoder, "mean_norm", None)


class RawMeans:
    """Per-dimension float64 sums of the raw means BatchNorm sees in eval mode (a forward pre-hook),
    shifted by the running mean at the start (no cancellation when the means barely vary)."""

    def __init__(self, bn: torch.nn.BatchNorm1d):
        self.shift = bn.running_mean.detach().double().clone()
        z = self.shift.numel()
        self.sums = torch.zeros(1 + 2 * z, dtype=torch.float64, device=self.shift.device)  # n, Σ(x-c), Σ(x-c)²

    def __call__(self, module, args) -> None:
        if module.training:
            return
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
        z = self.shift.numel()
        n, s, ss = int(sums[0].item()), sums[1 : 1 + z], sums[1 + z :]
        if n < 2:
            return n, s, torch.full_like(s, math.nan)
        return n, s / n + self.shift, (ss - s * s / n) / (n - 1)


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def bound_record(n: int, mean: torch.Tensor, var: torch.Tensor, bn: torch.nn.BatchNorm1d, stage: str, epoch: int) -> dict:
    """What metrics.json says (`bn_bound`): broken, the dimensions below THRESHOLD·ε, the smallest
    variances, and how far eval-mode BatchNorm moves the texts' average mean from β, in prior s.d."""
    running_var = bn.running_var.detach().double()
    eps, gamma = float(bn.eps), bn.weight.detach().double()
    limit = THRESHOLD * eps
    low = (var < limit) | (running_var < limit)
    shift = (gamma * (mean - bn.running_mean.detach().double()) / (running_var + eps).sqrt()).abs()
    dims = low.nonzero().flatten().tolist()
    return {
        "broken": bool(dims),
        "dims": dims,
        "latent_dim": int(var.numel()),
        "min_raw_var": _number(var.min().item()),
        "min_running_var": _number(running_var.min().item()),
        "eps": eps,
        "threshold": limit,
        "max_eval_shift": _number(shift.max().item()),
        "texts": n,
        "stage": stage,
        "epoch": epoch if stage == "val" else None,  # a test's trainer may not know its checkpoint's epoch
    }


def warning_line(r: dict) -> str:
    dims = r["dims"]
    shown = ", ".join(map(str, dims[:SHOWN_DIMS])) + (", …" if len(dims) > SHOWN_DIMS else "")
    where = "test" if r["stage"] == "test" else f"validation (epoch {r['epoch'] + 1})"
    texts = f"{r['texts']} {'test' if r['stage'] == 'test' else 'validation'} texts"
    shift = r["max_eval_shift"] or 0.0
    # said when it matters: a mean one prior s.d. off costs ½ nat of KL in that dimension for every text
    moved = f" and eval-mode BatchNorm moves the texts' mean up to {shift:.2g} prior s.d. off β" if shift >= 1 else ""
    return (
        f"{PREFIX}BN-VAE's bound does not hold at {where}: in {len(dims)} of {r['latent_dim']} latent dimensions "
        f"({shown}) the raw posterior means vary by less than {THRESHOLD:g}·bn_eps (variance down to "
        f"{r['min_raw_var']:.2g} over the {texts}, running variance down to {r['min_running_var']:.2g}; "
        f"bn_eps = {r['eps']:.2g}), so KL ≥ Z·γ²/2 is not guaranteed{moved}; KL, AU, MI and IW-NLL of this run are "
        "not BN-VAE's: lower model.bn_eps well below that variance (e.g. 1e-10) and train again (metrics.json: bn_bound)"
    )


class BNBoundCheck(Callback):
    """Measures BN-VAE's bound at every validation of a fit (not the sanity check) and every test,
    stores the record as the model's `bn_bound` (saved in its checkpoints, so a test of the best
    checkpoint starts from that epoch's record and replaces it with its own: the test's is the one
    metrics.json keeps), and prints one `seqvae: warning:` line when the bound is broken.

    Not every validation repeats it: once an encoder has escaped the bound it stays escaped, and
    the same line every epoch would bury the rest of the log. A validation warns when the broken
    dimensions differ from those of the last validation warning (a first break, more or other
    dimensions; a recovery resets it); a test pass always says it, once: its numbers are the run's.
    Does nothing for a model without BN-VAE."""

    def __init__(self):
        self._means: RawMeans | None = None
        self._handle = None
        self._warned: dict[str, list[int]] = {}

    def _start(self, trainer, pl_module) -> None:
        bn = mean_norm(pl_module)
        if bn is None or trainer.sanity_checking:
            return
        self._means = RawMeans(bn)
        self._handle = bn.register_forward_pre_hook(self._means)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._start(trainer, pl_module)

    def on_test_epoch_start(self, trainer, pl_module):
        self._start(trainer, pl_module)

    def _end(self, trainer, pl_module, stage: str) -> None:
        if self._handle is None:
            return
        self._handle.remove()
        means, self._means, self._handle = self._means, None, None
        bn = mean_norm(pl_module)
        n, mean, var = means.mean_var(trainer)
        if n < 2:
            return
        record = bound_record(n, mean, var, bn, stage, trainer.current_epoch)
        pl_module.bn_bound = record
        if not record["broken"]:
            self._warned.pop(stage, None)
            return
        if stage == "val" and self._warned.get(stage) == record["dims"]:
            return
        self._warned[stage] = record["dims"]
        if trainer.is_global_zero:
            print(warning_line(record), file=sys.stderr)

    def on_validation_epoch_end(self, trainer, pl_module):
        self._end(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer, pl_module):
        self._end(trainer, pl_module, "test")
