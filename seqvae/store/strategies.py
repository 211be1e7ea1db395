"""The strategy classes (`class_path:` options of the model: KL schedules and penalties,
regularisers, posteriors, encoders, …), each declared where it is defined."""

from __future__ import annotations

# Every strategy class by name, declared where it is defined (`strategy`; the strategy bases'
# subclasses declare themselves): the checkpoint loader allows them in weights-only loading, and
# `class_path: seqvae.<Name>` finds them.
STRATEGIES: dict[str, type] = {}


def strategy(cls: type) -> type:
    """Declares `cls` a strategy class (a class decorator; `__init_subclass__` of the bases)."""
    STRATEGIES[cls.__name__] = cls
    return cls


def declares_subclasses(base: type) -> type:
    """A strategy base whose subclasses declare themselves, wherever they are defined."""
    strategy(base)
    base.__init_subclass__ = classmethod(_declare_subclass)
    return base


def _declare_subclass(cls, **kwargs) -> None:
    strategy(cls)
