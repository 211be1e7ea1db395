"""The strategy classes (`class_path:` options of the model: KL schedules and penalties,
regularisers, posteriors, encoders, …), each declared where it is defined.

On the ground floor so that the checkpoint loader reads the registry without importing the
rooms that fill it: a strategy's own module declares it when it is imported."""

from __future__ import annotations

# Every strategy class by name, declared where it is defined (`strategy`; the strategy bases'
# subclasses declare themselves): `class_path: seqvae.<Name>` finds them, and checkpoints may
# carry them (weights-only loading).
STRATEGIES: dict[str, type] = {}


def strategy(cls: type) -> type:
    """Declares `cls` a strategy class (a class decorator; `__init_subclass__` of the bases), and
    allows it in torch's weights-only unpickler under its module path and, for seqvae's own, the
    flat path that checkpoints written before the subpackages pickled it with
    (`seqvae.schedules.LinearKLWarmup`)."""
    import torch.serialization  # loaded already: every strategy's module imports torch

    STRATEGIES[cls.__name__] = cls
    names = [cls]
    if cls.__module__.startswith("seqvae."):
        names.append((cls, f"seqvae.{cls.__module__.rsplit('.', 1)[1]}.{cls.__qualname__}"))
    torch.serialization.add_safe_globals(names)
    return cls


def declares_subclasses(base: type) -> type:
    """A strategy base whose subclasses declare themselves, wherever they are defined."""
    strategy(base)
    base.__init_subclass__ = classmethod(_declare_subclass)
    return base


def _declare_subclass(cls, **kwargs) -> None:
    strategy(cls)
