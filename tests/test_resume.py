"""Exact resume after a kill mid-epoch (PeriodicCheckpoint, the stateful train loader, RNG states
in the checkpoint), atomic checkpoint writes, and the samplers' sharding across DDP ranks."""

from __future__ import annotations

import logging
import os

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from test_model import datamodule, tiny_model, trainer, write_corpus

from seqvae import AggressiveTraining, AtomicCheckpointIO, DualKL, FullCovGaussianPosterior, PeriodicCheckpoint
from seqvae.text.datamodule import BucketBatchSampler, RandomBatchSampler


@pytest.fixture
def corpus(tmp_path):
    write_corpus(tmp_path / "train.txt", 120, 0)
    write_corpus(tmp_path / "valid.txt", 40, 1)
    write_corpus(tmp_path / "test.txt", 40, 2)
    return tmp_path


class Killed(Exception):
    pass


class KillAt(Callback):
    """Stands in for SIGKILL: the run dies after this batch, before anything else is saved."""

    def __init__(self, epoch: int, batch_idx: int):
        self.epoch, self.batch_idx = epoch, batch_idx

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch_idx:
            raise Killed


def fit(
    root, directory, every_n_batches=None, kill=None, ckpt_path=None, aggressive=False, batching="bucket", val_check_interval=1.0,
    dual_kl=False,
):  # fmt: skip
    pl.seed_everything(0)
    dm = datamodule(root, batching=batching)
    agg = AggressiveTraining(max_inner_steps=5, window=2) if aggressive else None
    # iVAE (dual_kl): critics with their own Adam steps inside every training step, in the checkpoint
    ivae = dict(posterior=FullCovGaussianPosterior(), kl_penalty=DualKL(steps=2, hidden=8, layers=1, lr=1e-2)) if dual_kl else {}
    model = tiny_model(dm.vocab_size, word_dropout=0.3, aggressive=agg, **ivae)
    callbacks = [ModelCheckpoint(dirpath=directory, save_last=True), PeriodicCheckpoint(None, every_n_batches)]
    callbacks += [KillAt(*kill)] if kill else []
    t = trainer(root, max_epochs=2, limit_val_batches=2, num_sanity_val_steps=2, enable_checkpointing=True, callbacks=callbacks,
                val_check_interval=val_check_interval)  # fmt: skip
    try:
        t.fit(model, dm, ckpt_path=ckpt_path)
    except Killed:
        return None
    return model


def same_state(x, y) -> bool:
    """Tensors equal bit for bit, in nested state (an optimiser's state dict: DualKL's critics')."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same_state(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return type(x) is type(y) and len(x) == len(y) and all(map(same_state, x, y))
    return x == y


def assert_same_parameters(a, b):
    assert a.num_updates == b.num_updates
    assert a.state_dict().keys() == b.state_dict().keys()
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert same_state(x, y), name


@pytest.mark.parametrize("case", ["bucket", "padded", "aggressive", "dual_kl"])
def test_killed_mid_epoch_and_resumed_gives_bit_identical_parameters(corpus, tmp_path, case):
    kw = {"aggressive": case == "aggressive", "batching": "padded" if case == "padded" else "bucket", "dual_kl": case == "dual_kl"}
    straight = fit(corpus, tmp_path / "a", **kw)
    # Checkpoints after batches 3 and 6 of each epoch; killed after batch 5 of epoch 1: the
    # resumed run redoes batches 4 and 5 of epoch 1 from the batch-3 checkpoint.
    assert fit(corpus, tmp_path / "b", every_n_batches=3, kill=(1, 4), **kw) is None
    saved = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 3}]
    assert saved["seqvae"]["rng"]["epoch"] == 1
    resumed = fit(corpus, tmp_path / "b", every_n_batches=3, ckpt_path=tmp_path / "b" / "last.ckpt", **kw)
    assert_same_parameters(straight, resumed)
    # the epoch line's mean train/loss of the resumed epoch covers its batches from before the kill
    assert resumed.train_loss_mean.state_dict() == straight.train_loss_mean.state_dict()
    assert straight.train_loss_mean.epoch == 1 and straight.train_loss_mean.count == 120  # every training text once


def test_resume_from_a_validation_inside_the_epoch_is_exact(corpus, tmp_path):
    # val_check_interval 0.5: ModelCheckpoint writes last.ckpt at the mid-epoch validation.
    straight = fit(corpus, tmp_path / "a", val_check_interval=0.5)
    n = straight.trainer.num_training_batches
    assert fit(corpus, tmp_path / "b", kill=(1, n - 2), val_check_interval=0.5) is None
    saved = torch.load(tmp_path / "b" / "last.ckpt", weights_only=True)
    assert saved["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": n // 2}]
    assert saved["seqvae"]["rng"]["epoch"] == 1
    resumed = fit(corpus, tmp_path / "b", ckpt_path=tmp_path / "b" / "last.ckpt", val_check_interval=0.5)
    assert_same_parameters(straight, resumed)


def test_mid_epoch_checkpoints_leave_training_unchanged(corpus, tmp_path):
    # Saving after every batch draws nothing from any RNG and changes no state.
    assert_same_parameters(fit(corpus, tmp_path / "a"), fit(corpus, tmp_path / "b", every_n_batches=1))


def test_periodic_checkpoint_skips_the_last_batch_and_writes_last_ckpt(corpus, tmp_path):
    pl.seed_everything(0)
    dm = datamodule(corpus)
    periodic = PeriodicCheckpoint(every_n_minutes=None, every_n_batches=1)
    t = trainer(corpus, max_epochs=1, limit_train_batches=5, limit_val_batches=1, enable_checkpointing=True,
                callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True), periodic])  # fmt: skip
    t.fit(tiny_model(dm.vocab_size), dm)
    assert periodic.saves == 4  # after batches 1-4, not after the epoch's last (the epoch-end save follows)
    assert isinstance(t.strategy.checkpoint_io, AtomicCheckpointIO)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".ckpt") == ["epoch=0-step=10.ckpt", "last.ckpt"]


def test_atomic_checkpoint_io_keeps_the_old_file_when_a_save_dies(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state": torch.arange(3)}, path)

    def dying_save(obj, f, *args, **kwargs):
        f.write(b"partial bytes")
        raise KeyboardInterrupt  # a kill in the middle of the write

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state": torch.arange(5)}, path)
    monkeypatch.undo()
    assert torch.equal(torch.load(path, weights_only=True)["state"], torch.arange(3))
    assert os.listdir(tmp_path) == ["last.ckpt"]  # no temporary file left behind


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_training_shards_are_disjoint_equal_parts_of_the_epoch(cls):
    lengths = [3 + i % 5 for i in range(203)]
    whole = cls(lengths, 8, shuffle=True, seed=3)
    whole.set_epoch(2)
    order = list(whole)
    shards = []
    for rank in range(3):
        s = cls(lengths, 8, shuffle=True, seed=3, num_replicas=3, rank=rank)
        s.set_epoch(2)
        shards.append(list(s))
        assert len(shards[-1]) == len(s) == len(order) // 3
    assert [b for r in range(3) for b in shards[r]] != order  # interleaved, not blocks
    flat = [tuple(b) for shard in shards for b in shard]
    assert len(set(flat)) == len(flat) and set(flat) <= {tuple(b) for b in order}


@pytest.mark.parametrize("cls", [BucketBatchSampler, RandomBatchSampler])
def test_evaluation_shards_are_contiguous_and_cover_every_text_once(cls):
    lengths = [3 + i % 5 for i in range(203)]
    whole = list(cls(lengths, 8, shuffle=False))
    shards = [cls(lengths, 8, shuffle=False, num_replicas=3, rank=r) for r in range(3)]
    assert [b for s in shards for b in s] == whole  # rank order = the single-process order
    assert [len(s) for s in shards] == [len(list(s)) for s in shards]
    assert max(len(s) for s in shards) - min(len(s) for s in shards) <= 1
    assert shards[2].preceding_sizes == [len(b) for b in whole[: len(shards[0]) + len(shards[1])]]


def test_resume_skips_the_batches_done_in_that_epoch_only():
    lengths = [3 + i % 5 for i in range(100)]
    s = BucketBatchSampler(lengths, 8, shuffle=True, seed=1)
    s.set_epoch(4)
    full = list(s)
    s.set_epoch(4)
    s.resume(4, 5)
    assert list(s) == full[5:]
    s.set_epoch(4)
    assert list(s) == full
    s.resume(3, 5)  # a checkpoint of another epoch skips nothing
    s.set_epoch(4)
    assert list(s) == full


def test_periodic_checkpoint_saves_without_lightnings_weights_only_notice(corpus, tmp_path, caplog):
    # Issue 45: "`weights_only` was not set, defaulting to `False`" was logged once per mid-epoch save.
    pl.seed_everything(0)
    dm = datamodule(corpus)
    periodic = PeriodicCheckpoint(every_n_minutes=None, every_n_batches=1)
    t = trainer(corpus, max_epochs=1, limit_train_batches=3, limit_val_batches=1, enable_checkpointing=True,
                callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True), periodic])  # fmt: skip
    with caplog.at_level(logging.INFO):
        t.fit(tiny_model(dm.vocab_size), dm)
    assert periodic.saves == 2
    assert not [r for r in caplog.records if "weights_only" in r.getMessage()]
    assert "optimizer_states" in torch.load(tmp_path / "last.ckpt", weights_only=True)  # still the whole state
