"""Callbacks that own parts of the training loop."""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import torch
from pytorch_lightning import Callback
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.utilities import rank_zero_warn

from seqvae.store.checkpoints import LoaderIO, load_checkpoint
from seqvae.store.files import atomic_open
from seqvae.text.corpus import run_seed
from seqvae.training.allocator import release_freed_memory


class PlateauRule(Callback):
    """He et al.'s learning-rate rule. After each validation: if the monitored loss rose above
    the best seen (`patience` epochs in a row) and the epoch index is ≥ `min_epochs`, halve the
    learning rate, reload the best checkpoint's weights, and reset the optimisers' state; stop
    after the `max_decays`-th halving. Runs before ModelCheckpoint (Lightning orders checkpoint
    callbacks last), so `last.ckpt` already holds the decision and a resume applies it.

    Args:
        monitor: Validation key to watch (-ELBO with KL weight 1).
        patience: Epochs without improvement before a decay (2 in He et al., 5 in Li et al.).
        min_epochs: No decay before this (0-based) epoch (15 in the references).
        factor: Learning-rate multiplier at each decay.
        max_decays: Stop training at this many decays.
        enabled: False: a constant learning rate and no early stop (on by default, as in the
            references, so runs match theirs).
    """

    def __init__(
        self,
        monitor: str = "val/loss",
        patience: int = 2,
        min_epochs: int = 15,
        factor: float = 0.5,
        max_decays: int = 5,
        enabled: bool = True,
    ):
        self.monitor, self.patience, self.min_epochs = monitor, patience, min_epochs
        self.factor, self.max_decays, self.enabled = factor, max_decays, enabled
        self.best: float | None = None
        self.bad_epochs = 0
        self.decays = 0

    def on_validation_end(self, trainer, pl_module):
        # `trainer.training` is False during fit's validation; the stage is what tells.
        if trainer.sanity_checking or trainer.state.fn != "fit" or self.monitor not in trainer.callback_metrics:
            return
        if not self.enabled:
            return
        value = float(trainer.callback_metrics[self.monitor])
        if self.best is not None and value > self.best:
            self.bad_epochs += 1
            if self.bad_epochs >= self.patience and trainer.current_epoch >= self.min_epochs:
                self._decay(trainer, pl_module)
                # As the reference does: the current (worse) value becomes the new bar.
                self.best, self.bad_epochs = value, 0
        else:
            self.best, self.bad_epochs = value, 0

    def _decay(self, trainer, pl_module):
        self.decays += 1
        best_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if best_path:
            state = load_checkpoint(best_path, "plateau (best checkpoint)", map_location=pl_module.device)["state_dict"]
            pl_module.load_state_dict(state)
        for opt in trainer.optimizers:
            opt.state.clear()
            for group in opt.param_groups:
                group["lr"] *= self.factor
        if self.decays >= self.max_decays:
            trainer.should_stop = True

    def state_dict(self):
        return {"best": self.best, "bad_epochs": self.bad_epochs, "decays": self.decays}

    def load_state_dict(self, state_dict):
        self.best, self.bad_epochs, self.decays = state_dict["best"], state_dict["bad_epochs"], state_dict["decays"]


class AtomicCheckpointIO(LoaderIO):
    """Writes a checkpoint to a temporary file in the target's directory, fsyncs it, then
    renames it over the target (`seqvae.store.files.atomic_open`): a kill during a save leaves
    the previous file whole. (Lightning's own write goes through an fsspec transaction whose temporary file is in
    the system temp directory; moved across file systems, that is a copy into the target.) Reads
    through the one loader (`LoaderIO`: weights only, a command's `--ckpt_path` read once)."""

    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        if "://" in str(path):  # remote storage: Lightning's writer
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_open(path, "wb") as f:
            torch.save(checkpoint, f)


class PeriodicCheckpoint(Callback):
    """Rewrites the run's `last.ckpt` during an epoch, so that a run killed mid-epoch resumes
    (`--ckpt_path last`) from there: the checkpoint holds the loop position, the sampler
    position and the RNG states, and the resumed run continues exactly. Also makes every
    checkpoint write of the run atomic (AtomicCheckpointIO).

    Saves after a training batch when `every_n_minutes` of wall time passed since the last
    save, or every `every_n_batches` batches of an epoch; never after an epoch's last batch (the
    epoch-end checkpoint follows). None turns a trigger off. Needs a ModelCheckpoint with
    `save_last` (the CLI's `checkpoint`); it writes that callback's last checkpoint path.

    Args:
        every_n_minutes: Wall-time interval between mid-epoch saves.
        every_n_batches: Save every this many training batches within an epoch.
    """

    def __init__(self, every_n_minutes: float | None = 10.0, every_n_batches: int | None = None):
        self.every_n_minutes, self.every_n_batches = every_n_minutes, every_n_batches
        self.saves = 0
        self._last_save = time.monotonic()

    def setup(self, trainer, pl_module, stage):
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()

    def on_train_start(self, trainer, pl_module):
        self._last_save = time.monotonic()
        if trainer.is_global_zero and trainer.checkpoint_callback is not None and trainer.checkpoint_callback.dirpath:
            # Temporary files of saves that a kill interrupted (AtomicCheckpointIO's naming).
            for tmp in Path(trainer.checkpoint_callback.dirpath).glob(".*.ckpt.*.tmp"):
                tmp.unlink(missing_ok=True)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._last_save = time.monotonic()  # any save (epoch end too) restarts the interval

    def _due(self, trainer, batch_idx: int) -> bool:
        if self.every_n_batches and (batch_idx + 1) % self.every_n_batches == 0:
            return True
        if self.every_n_minutes is None:
            return False
        if trainer.world_size > 1:
            # Clocks differ, so rank 0 decides for all; asked every 50 batches, not every batch,
            # because a broadcast is a collective on the training path.
            if (batch_idx + 1) % 50:
                return False
            return trainer.strategy.broadcast(time.monotonic() - self._last_save >= 60 * self.every_n_minutes, src=0)
        return time.monotonic() - self._last_save >= 60 * self.every_n_minutes

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx + 1 >= trainer.num_training_batches or not self._due(trainer, batch_idx):
            return
        checkpoint = trainer.checkpoint_callback
        if checkpoint is None or not checkpoint.save_last or checkpoint.dirpath is None:
            rank_zero_warn("PeriodicCheckpoint: no ModelCheckpoint with save_last; no mid-epoch checkpoint written")
            self.every_n_minutes = self.every_n_batches = None
            return
        path = checkpoint.last_model_path or checkpoint.format_checkpoint_name({}, checkpoint.CHECKPOINT_NAME_LAST)
        checkpoint.last_model_path = path  # before the save: it is part of the saved state
        # weights_only=False: save the whole training state (optimisers, loops, callbacks), as
        # ModelCheckpoint's own last.ckpt does. Said explicitly, else Lightning logs "`weights_only`
        # was not set, defaulting to `False`" at every save: that is about what is *saved*, not
        # how checkpoints are *loaded* (store/checkpoints.py loads with weights_only=True).
        trainer.save_checkpoint(path, weights_only=False)
        self.saves += 1
        self._last_save = time.monotonic()


def _numpy_state() -> tuple:
    """numpy's global RNG state as plain Python values (checkpoints load with weights_only)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return name, keys.tolist(), int(pos), int(has_gauss), float(cached)


class ExactResume(Callback):
    """A resumed run ends with exactly the parameters of an uninterrupted one (on CPU).

    - At every epoch start the global RNGs (dropout, word dropout, z noise) are reseeded from
      (run seed, epoch): each epoch's noise does not depend on what ran before it (sanity checks,
      validation, an interruption), so a run resumed at an epoch boundary continues exactly.
    - A checkpoint written during fit (mid-epoch, or at a validation inside the epoch) carries
      the RNG states the next training batch would start from (every DDP rank's own), as
      `checkpoint["seqvae"]["rng"]`; a run resumed inside the same epoch restores them just
      before its first training step, whatever ran since the load (sanity checks) drew.
    The sampler position travels with the training DataLoader (`data._TrainLoader`, Lightning's
    stateful-dataloader protocol); the evaluation generator is reseeded at every evaluation pass;
    aggressive training keeps its own RNG in the model's checkpoint state. SeqVAE adds this
    callback itself (`configure_callbacks`).
    """

    def __init__(self):
        self._pending: dict | None = None

    def on_train_epoch_start(self, trainer, pl_module):
        seed = run_seed() * 1_000_003 + trainer.current_epoch
        torch.manual_seed(seed)
        random.seed(seed)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        state, self._pending = self._pending, None
        if state is None or state["epoch"] != trainer.current_epoch:
            return
        torch.set_rng_state(state["torch"])
        random.setstate(state["random"])
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        if isinstance(state.get("cuda"), torch.Tensor) and pl_module.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], pl_module.device)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.state.fn != "fit":
            return
        rng = {
            "epoch": trainer.current_epoch,
            "torch": torch.get_rng_state(),
            "random": random.getstate(),
            "numpy": _numpy_state(),
            # This rank's device only: a resume may see a different number of GPUs.
            "cuda": torch.cuda.get_rng_state(pl_module.device) if pl_module.device.type == "cuda" else None,
        }
        if trainer.world_size > 1:  # every rank's own states (their batches differ)
            states = [None] * trainer.world_size
            torch.distributed.all_gather_object(states, rng)
            rng = {"epoch": rng["epoch"], "ranks": states}
        checkpoint.setdefault("seqvae", {})["rng"] = rng

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        rng = checkpoint.get("seqvae", {}).get("rng")
        if rng is not None and "ranks" in rng:  # another world size: not exact anyway
            rng = rng["ranks"][trainer.global_rank] if trainer.world_size == len(rng["ranks"]) else None
        self._pending = rng


class FitClock(Callback):
    """Training wall time, accumulated into the model's `fit_seconds` across resumes (saved in
    its checkpoint state): counted from the start of training, brought up to date at every
    validation (logged as `train/wall_seconds`) and every checkpoint save."""

    def __init__(self):
        self._since: float | None = None

    def _tick(self, pl_module) -> None:
        if self._since is not None:
            now = time.monotonic()
            pl_module.fit_seconds += now - self._since
            self._since = now

    def on_train_start(self, trainer, pl_module):
        self._since = time.monotonic()

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._tick(pl_module)
            pl_module.log("train/wall_seconds", pl_module.fit_seconds)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        self._tick(pl_module)
        checkpoint.setdefault("seqvae", {})["fit_seconds"] = pl_module.fit_seconds

    def on_train_end(self, trainer, pl_module):
        self._tick(pl_module)
        self._since = None


class TextSamples(Callback):
    """At every validation of a fit, a TEXT entry in TensorBoard (`val/samples`): the first `n`
    validation texts, their greedy reconstructions from the posterior means, and `n` texts
    decoded from z ~ N(0, I). A collapsed model shows one sentence repeated. Decoding runs in
    eval mode with its own generator (seed 0): it draws nothing from the training RNGs.

    Args:
        n: Texts of each kind (0 turns the entry off).
        max_length: Most tokens decoded per text.
    """

    def __init__(self, n: int = 4, max_length: int = 40):
        self.n, self.max_length = n, max_length

    def on_validation_end(self, trainer, pl_module):
        if not self.n or trainer.sanity_checking or trainer.state.fn != "fit" or not trainer.is_global_zero:
            return
        dm, experiment = trainer.datamodule, getattr(trainer.logger, "experiment", None)
        if dm is None or pl_module.vocab is None or not hasattr(experiment, "add_text"):
            return
        words = dm.corpora["val"].texts[: self.n] if "val" in dm.corpora else []  # labels already taken off
        texts = [" ".join(t) for t in words]
        lines = [f"**epoch {trainer.current_epoch + 1}**", "", "| input | reconstruction |", "|---|---|"]
        if texts and pl_module.encoder is not None:
            rec = pl_module.reconstruct(words, max_length=self.max_length)
            lines += [f"| {_cell(a)} | {_cell(b)} |" for a, b in zip(texts, rec)]
        lines += ["", "| from the prior |", "|---|"]
        lines += [f"| {_cell(t)} |" for t in pl_module.sample(self.n, max_length=self.max_length, seed=0)]
        experiment.add_text("val/samples", "\n".join(lines), global_step=trainer.global_step)


class LatentDimensions(Callback):
    """At every validation of a fit and at the end of a test, a TensorBoard image
    (`val/latent_dimensions`, `test/latent_dimensions`; `latent_figure`): per latent
    dimension, Var_x(E[z_d]) against AU's threshold and the mean KL_d. It shows which units are
    active, not only how many.

    Args:
        enabled: Write the image (needs matplotlib and a TensorBoard logger).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._dims: dict | None = None

    def _take(self, pl_module, metrics) -> None:
        # From the model's metrics at the epoch's end: a callback's hook runs before the
        # LightningModule's, which computes and resets them. On every DDP rank (a collective).
        self._dims = metrics.per_dimension() if self.enabled and pl_module.encoder is not None else None

    def _draw(self, trainer, pl_module, stage: str) -> None:
        dims, self._dims = self._dims, None
        experiment = getattr(trainer.logger, "experiment", None)
        if not self.enabled or dims is None or not trainer.is_global_zero or not hasattr(experiment, "add_figure"):
            return
        from seqvae.training.latent_figure import latent_figure

        title = f"{stage}, epoch {trainer.current_epoch + 1}" if stage == "val" else stage
        fig = latent_figure(dims["var_mu"], dims["kl"], title=title)
        experiment.add_figure(f"{stage}/latent_dimensions", fig, global_step=trainer.global_step)

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._take(pl_module, pl_module.val_metrics)

    def on_test_epoch_end(self, trainer, pl_module):
        self._take(pl_module, pl_module.test_metrics)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._draw(trainer, pl_module, "val")

    def on_test_end(self, trainer, pl_module):
        self._draw(trainer, pl_module, "test")


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "(empty)"


class EvalMemory(Callback):
    """After each evaluation batch, hands the heap's free memory back to the kernel once the
    resident size has grown by more than `keep` bytes since the last release
    (`allocator.release_freed_memory`): with `reuse_freed_memory`, evaluation's batch-to-batch
    growing temporaries would otherwise grow the heap with the test set (1.2 GB over 10,000
    texts). Numbers are unchanged; SeqVAE adds this callback itself."""

    def __init__(self, keep: int = 128 * 2**20):
        self.keep = keep

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        release_freed_memory(self.keep)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        release_freed_memory(self.keep)
