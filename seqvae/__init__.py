"""seqvae: LSTM sequence VAEs that do not collapse, with the metrics that tell.

The names below load on first use (PEP 562), so that `seqvae --help`, `seqvae compare` and the
other tools start without importing torch and Lightning; `from seqvae import SeqVAE` and the
configs' `class_path: seqvae.LinearKLWarmup` work as before.
"""

import importlib

_WHERE = {
    "AggressiveTraining": "aggressive",
    "AtomicCheckpointIO": "callbacks",
    "PeriodicCheckpoint": "callbacks",
    "PlateauRule": "callbacks",
    "reuse_freed_memory": "allocator",
    "TextDataModule": "data",
    "Vocabulary": "data",
    "read_corpus": "data",
    "BatchFreeBits": "losses",
    "CosineDispersion": "losses",
    "FreeBits": "losses",
    "KLPenalty": "losses",
    "Regularizer": "losses",
    "StandardKL": "losses",
    "SeqVAE": "model",
    "ConstantKL": "schedules",
    "CyclicalKL": "schedules",
    "KLSchedule": "schedules",
    "LinearKLWarmup": "schedules",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    raise AttributeError(f"module 'seqvae' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_WHERE])
