"""KL weight schedules. `weight(update, updates_per_epoch, max_epochs)` is the weight used for
optimiser update number `update` (0-based), driven by the module's own update counter (not
`trainer.global_step`, which counts optimiser steps and doubles with two optimisers)."""

from __future__ import annotations

from seqvae.options import AT_LEAST_ONE, NON_NEGATIVE, PROBABILITY, Range
from seqvae.store.strategies import declares_subclasses


@declares_subclasses
class KLSchedule:
    """Interface: the KL weight for one training update."""

    def weight(self, update: int, updates_per_epoch: int, max_epochs: int) -> float:
        raise NotImplementedError


class ConstantKL(KLSchedule):
    """A fixed weight: 1.0 is the plain VAE, β ≠ 1 a β-VAE, 0.0 an autoencoder.

    Args:
        value: The KL weight.
    """

    option_ranges = {"value": NON_NEGATIVE}  # 0: the autoencoder; a negative weight would reward KL

    def __init__(self, value: float = 1.0):
        self.value = value

    def weight(self, update: int, updates_per_epoch: int, max_epochs: int) -> float:
        return self.value


class LinearKLWarmup(KLSchedule):
    """He et al.: the weight starts at `start` and rises by (1 - start)/(warmup_epochs · batches
    per epoch) BEFORE every update, capped at 1. We use the true number of batches per epoch;
    the reference divides by N/32, which ends its warm-up early when buckets leave short batches.

    Args:
        start: Weight before the first update (the reference's `kl_start`, 0.1 in the paper).
        warmup_epochs: Epochs until the weight reaches 1 (10 in the paper).
    """

    # The weight rises from `start` to 1; warmup_epochs 0: weight 1 from the first update.
    option_ranges = {"start": PROBABILITY, "warmup_epochs": NON_NEGATIVE}

    def __init__(self, start: float = 0.1, warmup_epochs: float = 10.0):
        self.start, self.warmup_epochs = start, warmup_epochs

    def weight(self, update: int, updates_per_epoch: int, max_epochs: int) -> float:
        if self.warmup_epochs <= 0:
            return 1.0
        total = self.warmup_epochs * updates_per_epoch
        if update + 1 >= total:  # exactly 1 from update total - 1 on (the sum below can round to 1 - ε)
            return 1.0
        step = (1.0 - self.start) / total
        return min(1.0, self.start + step * (update + 1))


class CyclicalKL(KLSchedule):
    """Fu et al. (2019): `cycles` cycles over the run; in each the weight rises linearly from 0
    to 1 over the first `ratio` of the cycle, then holds at 1.

    Args:
        cycles: Number of cycles M over `max_epochs`.
        ratio: Fraction R of each cycle spent rising.
    """

    # The cycle length divides by cycles and the rise by ratio, a fraction of a cycle.
    option_ranges = {"cycles": AT_LEAST_ONE, "ratio": Range(lambda v: 0 < v <= 1, "in (0, 1]")}

    def __init__(self, cycles: int = 4, ratio: float = 0.5):
        self.cycles, self.ratio = cycles, ratio

    def weight(self, update: int, updates_per_epoch: int, max_epochs: int) -> float:
        period = max_epochs * updates_per_epoch / self.cycles
        phase = (update % period) / period
        return min(1.0, phase / self.ratio)


class CappedKLWarmup(KLSchedule):
    """A linear warm-up in (fractional) epochs, after a delay, capped below 1: before update u
    (0-based) of E updates per epoch, w = min(max_weight, start + (1 − start)·clip((u/E − delay)/warmup, 0, 1)).
    WAE-RNF's (Wang & Wang 2019; SPEC §12.4): start 0, delay 3, warmup 20, max_weight 0.8, in its
    2000-batch epochs (w = clip((t − 6000)/40000, 0, 1), capped at 0.8: it never reaches 1).

    Args:
        start: Weight from the first update until the delay has passed.
        delay_epochs: Epochs before the weight starts to rise.
        warmup_epochs: Epochs over which it would rise from `start` to 1 (0: at once).
        max_weight: The cap.
    """

    option_ranges = {"start": PROBABILITY, "delay_epochs": NON_NEGATIVE, "warmup_epochs": NON_NEGATIVE, "max_weight": PROBABILITY}

    def __init__(self, start: float = 0.0, delay_epochs: float = 3.0, warmup_epochs: float = 20.0, max_weight: float = 0.8):
        self.start, self.delay_epochs, self.warmup_epochs, self.max_weight = start, delay_epochs, warmup_epochs, max_weight

    def weight(self, update: int, updates_per_epoch: int, max_epochs: int) -> float:
        elapsed = update / updates_per_epoch - self.delay_epochs
        rise = 1.0 if self.warmup_epochs <= 0 else min(1.0, max(0.0, elapsed / self.warmup_epochs))
        if self.warmup_epochs <= 0 and elapsed < 0:
            rise = 0.0
        return min(self.max_weight, self.start + (1.0 - self.start) * rise)
