"""seqvae: LSTM sequence VAEs that do not collapse, with the metrics that tell."""

import torch

from .aggressive import AggressiveTraining
from .allocator import reuse_freed_memory
from .callbacks import AtomicCheckpointIO, PeriodicCheckpoint, PlateauRule
from .data import TextDataModule, Vocabulary, read_corpus
from .losses import BatchFreeBits, CosineDispersion, FreeBits, KLPenalty, Regularizer, StandardKL
from .model import SeqVAE
from .schedules import ConstantKL, CyclicalKL, KLSchedule, LinearKLWarmup

# Checkpoints hold the strategy objects of the hyper-parameters (schedules, penalties,
# regularisers); allow exactly these classes under torch.load(weights_only=True).
torch.serialization.add_safe_globals(
    [AggressiveTraining, ConstantKL, CyclicalKL, LinearKLWarmup, StandardKL, FreeBits, BatchFreeBits, CosineDispersion]
)

__all__ = [
    "AggressiveTraining",
    "AtomicCheckpointIO",
    "BatchFreeBits",
    "ConstantKL",
    "CosineDispersion",
    "CyclicalKL",
    "FreeBits",
    "KLPenalty",
    "KLSchedule",
    "LinearKLWarmup",
    "PeriodicCheckpoint",
    "PlateauRule",
    "Regularizer",
    "SeqVAE",
    "StandardKL",
    "TextDataModule",
    "Vocabulary",
    "read_corpus",
    "reuse_freed_memory",
]
