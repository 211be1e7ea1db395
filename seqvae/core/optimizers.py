"""The optimiser of the encoder and the decoder as a strategy (`model.optimizer`); None is He et
al.'s SGD at `model.lr`. Each network gets its own instance (the aggressive steps and the plateau
rule address them apart). An encoder that brings its own (`TransformerEncoder(optimizer=...)`)
keeps it."""

from __future__ import annotations

import torch

from seqvae.options import Range
from seqvae.store.strategies import declares_subclasses


@declares_subclasses
class Optimizer:
    """Interface: `make(params, model_lr)` gives the optimiser of one network's parameters."""

    def make(self, params, model_lr: float) -> torch.optim.Optimizer:
        raise NotImplementedError


class Adam(Optimizer):
    """Adam with PyTorch's default betas and eps, as iVAE's reference (Fang et al. 2019: lr 8e-4
    for encoder and decoder; SPEC §11.3).

    Args:
        lr: Its learning rate; None: model.lr (whose default, 1.0, is SGD's).
    """

    option_ranges = {"lr": Range(lambda v: v is None or v > 0, "> 0 (null: model.lr)")}

    def __init__(self, lr: float | None = None):
        self.lr = lr

    def make(self, params, model_lr: float) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.lr or model_lr)

    def __repr__(self) -> str:
        return f"Adam(lr={self.lr})"


__all__ = ["Adam", "Optimizer"]
