"""Batching: the reference's equal-length bucket sampler and a padded one, both DDP-sharded and
resumable mid-epoch, and the stateful training DataLoader that records where an epoch is."""

from __future__ import annotations

import random
from collections.abc import Iterator

from torch.utils.data import DataLoader, Sampler


class _EpochHook:
    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class BucketBatchSampler(Sampler[list[int]]):
    """The reference batching: sort by length, cut runs of EQUAL length into batches of at most
    `batch_size`, keep those batches fixed, visit them in a fresh random order each epoch.
    No batch holds padding. With `shuffle=False` the order is by length (evaluation).

    Under DDP (`num_replicas` > 1) each rank gets its own part of every epoch: in training the
    batches at positions rank, rank + R, … of the epoch's order, cut to the same number on every
    rank (the last len % R batches of the order are left out that epoch); in evaluation a
    contiguous run of the by-length batches, so that every text is evaluated exactly once and
    the ranks' rows, gathered in rank order, are the single-process rows in the same order.
    `resume(epoch, n)` makes that epoch's iteration skip its first n batches (a mid-epoch
    resume: the order itself depends only on seed and epoch)."""

    def __init__(self, lengths: list[int], batch_size: int, shuffle: bool, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0
        # Lightning calls `batch_sampler.sampler.set_epoch(e)` at every epoch start, with the
        # restored epoch when a run resumes: that keeps a resumed run's batch order exact.
        self.sampler = _EpochHook(self)
        by_length: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            by_length.setdefault(n, []).append(i)
        self.batches = [
            idx[s : s + batch_size] for n in sorted(by_length) for idx in [by_length[n]] for s in range(0, len(idx), batch_size)
        ]
        self._init_shard(num_replicas, rank)

    def _init_shard(self, num_replicas: int, rank: int) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} of {num_replicas} replicas")
        self.num_replicas, self.rank = num_replicas, rank
        self._skip: tuple[int, int] | None = None
        n = len(self.batches)
        # Evaluation: this rank's contiguous slice [start, stop) of the batches.
        self._start, self._stop = rank * n // num_replicas, (rank + 1) * n // num_replicas

    @property
    def preceding_sizes(self) -> list[int]:
        """Evaluation under DDP: the sizes of the batches that the ranks before this one
        evaluate, in order (a rank replays their evaluation noise to start where one process
        would be)."""
        return [len(b) for b in self.batches[: self._start]] if not self.shuffle else []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, batches_done: int) -> None:
        """The iteration of `epoch` starts after its first `batches_done` batches (of this rank)."""
        self._skip = (int(epoch), int(batches_done))

    def _epoch_batches(self) -> list[list[int]]:
        """All batches of the current epoch in their order (before sharding)."""
        order = list(range(len(self.batches)))
        if self.shuffle:
            # Seeded by (seed, epoch), not by the global RNG: the epoch's order is reproducible
            # and does not depend on what else drew random numbers.
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return [self.batches[i] for i in order]

    def _shard(self, batches: list[list[int]]) -> list[list[int]]:
        if self.num_replicas == 1:
            return batches
        if self.shuffle:
            return batches[self.rank :: self.num_replicas][: len(batches) // self.num_replicas]
        return batches[self._start : self._stop]

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the order is drawn at the first batch, not when the iterator is made.
        # Lightning makes the first epoch's iterator before it calls set_epoch.
        epoch = self.epoch
        batches = self._shard(self._epoch_batches())
        if self.shuffle:
            self.epoch += 1
        if self._skip is not None and self._skip[0] == epoch:
            batches = batches[self._skip[1] :]
        self._skip = None
        yield from batches

    def __len__(self) -> int:
        n = len(self.batches)
        if self.num_replicas == 1:
            return n
        return n // self.num_replicas if self.shuffle else self._stop - self._start


class RandomBatchSampler(BucketBatchSampler):
    """Padded batches of random sentences (mixed lengths), reshuffled every epoch (sharded
    across DDP ranks as BucketBatchSampler is)."""

    def __init__(self, lengths: list[int], batch_size: int, shuffle: bool, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0
        self.sampler = _EpochHook(self)
        self.n = len(lengths)
        self.batches = [list(range(s, min(s + batch_size, self.n))) for s in range(0, self.n, batch_size)]
        self._init_shard(num_replicas, rank)

    def _epoch_batches(self) -> list[list[int]]:
        if not self.shuffle:
            return self.batches
        perm = list(range(self.n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(perm)
        return [perm[s : s + self.batch_size] for s in range(0, self.n, self.batch_size)]


class TrainLoader(DataLoader):
    """The training DataLoader, stateful for Lightning: a checkpoint records how many batches of
    which epoch the trainer has completed, and a mid-epoch restart makes the sampler skip them."""

    position = None  # set by TextDataModule: () -> {"epoch": e, "batches": n}

    def state_dict(self) -> dict:
        return self.position() if self.position is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.batch_sampler.resume(state["epoch"], state["batches"])


SAMPLERS = {"bucket": BucketBatchSampler, "padded": RandomBatchSampler}
