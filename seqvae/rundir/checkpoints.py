"""The one checkpoint loader: `torch.load(weights_only=True)` and the allow-list of seqvae's
classes that checkpoints may carry (the strategy objects of the hyper-parameters), under their
module paths now and under the flat paths that checkpoints written before the subpackages
pickled them with (`seqvae.schedules.LinearKLWarmup`); and a run's vocabulary, from its
vocab.json or a checkpoint. Everything that reads a checkpoint comes here.
"""

from __future__ import annotations

from pathlib import Path

import torch

# The modules whose strategy classes a checkpoint's hyper-parameters may carry: importing them
# declares their classes (`core.strategies.strategy`), which `allow_strategies` hands to torch.
from seqvae.core import aggressive, dual_kl, isobn, losses, optimizers, posteriors, schedules, transformer  # noqa: F401
from seqvae.core.strategies import STRATEGIES
from seqvae.errors import CorpusError
from seqvae.text.corpus import Vocabulary

_ALLOWED: set[type] = set()


def allow_strategies() -> None:
    """Every declared strategy class may be unpickled, under its module path and the flat path
    that checkpoints written before the subpackages pickled it with (`seqvae.schedules.X`)."""
    new = [c for c in STRATEGIES.values() if c not in _ALLOWED]
    torch.serialization.add_safe_globals([*new, *((c, f"seqvae.{c.__module__.rsplit('.', 1)[1]}.{c.__qualname__}") for c in new)])
    _ALLOWED.update(new)


allow_strategies()


def load_vocabulary(path: str | Path) -> Vocabulary:
    """The vocabulary of a run: its `vocab.json`, or the one saved inside a checkpoint."""
    path = Path(path)
    if not path.is_file():
        why = f"{path} is a directory, not a file" if path.is_dir() else f"no such file {path}"
        raise CorpusError(f"data.vocab: {why}")
    if path.suffix == ".json":
        try:
            return Vocabulary.load(path)
        except (ValueError, KeyError) as err:
            raise CorpusError(f"data.vocab: {path}: not a seqvae vocab.json ({err})") from None
    checkpoint = load_checkpoint(path, "data.vocab")
    if "vocab" not in checkpoint:
        raise CorpusError(f"data.vocab: {path}: the checkpoint holds no vocabulary (written before seqvae saved one)")
    return Vocabulary.from_str(checkpoint["vocab"])


def load_checkpoint(path: str | Path, option: str, map_location="cpu", **kwargs) -> dict:
    """torch.load with weights_only=True: a checkpoint is data, and one that carries anything
    but tensors, plain values and seqvae's registered classes is refused, in one line naming
    the option, instead of running the code it pickled."""
    import pickle

    allow_strategies()  # also those declared since this module was imported (a user's own classes)
    try:
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except FileNotFoundError:
        raise CorpusError(f"{option}: no such checkpoint file {path}") from None
    except IsADirectoryError:
        raise CorpusError(f"{option}: {path} is a directory, not a checkpoint file") from None
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CorpusError(
            f"{option}: {path}: refused to load (it carries objects other than weights and seqvae's settings; "
            f"only load checkpoints you trust with torch.load(weights_only=False) yourself): {first}"
        ) from None
    except (RuntimeError, EOFError, ValueError):
        # torch's own text names its zip reader's internals (`PytorchStreamReader failed reading
        # zip archive: failed finding central directory`), not what is wrong with the file.
        size = Path(path).stat().st_size
        raise CorpusError(
            f"{option}: {path}: not a readable checkpoint ({size} bytes: truncated, or not a file written by "
            "torch.save / seqvae fit)"
        ) from None
