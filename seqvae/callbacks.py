"""Callbacks that own parts of the training loop."""

from __future__ import annotations

import torch
from pytorch_lightning import Callback


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
    """

    def __init__(
        self, monitor: str = "val/loss", patience: int = 2, min_epochs: int = 15, factor: float = 0.5, max_decays: int = 5
    ):
        self.monitor, self.patience, self.min_epochs = monitor, patience, min_epochs
        self.factor, self.max_decays = factor, max_decays
        self.best: float | None = None
        self.bad_epochs = 0
        self.decays = 0

    def on_validation_end(self, trainer, pl_module):
        # `trainer.training` is False during fit's validation; the stage is what tells.
        if trainer.sanity_checking or trainer.state.fn != "fit" or self.monitor not in trainer.callback_metrics:
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
            state = torch.load(best_path, map_location=pl_module.device, weights_only=False)["state_dict"]
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
