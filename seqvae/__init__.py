"""seqvae: LSTM sequence VAEs that do not collapse, with the metrics that tell."""

from .callbacks import PlateauRule
from .data import TextDataModule, Vocabulary, read_corpus
from .losses import BatchFreeBits, CosineDispersion, FreeBits, KLPenalty, Regularizer, StandardKL
from .model import SeqVAE
from .schedules import ConstantKL, CyclicalKL, KLSchedule, LinearKLWarmup

__all__ = [
    "BatchFreeBits", "ConstantKL", "CosineDispersion", "CyclicalKL", "FreeBits", "KLPenalty", "KLSchedule",
    "LinearKLWarmup", "PlateauRule", "Regularizer", "SeqVAE", "StandardKL", "TextDataModule", "Vocabulary", "read_corpus",
]
