"""Allowed ranges of numeric options, checked where their object is built.

The CLI builds the model and the datamodule before it writes a run directory, so a bad value
stops there in one line that names the option as the user writes it (`model.lr: must be > 0,
got -0.5`), instead of as a traceback, or a silent no-op, later. A strategy class (KL schedule,
KL penalty, regulariser, aggressive training) declares its own `option_ranges`; SeqVAE checks
them (an error raised inside a nested class would reach the CLI user wrapped in jsonargparse's
"Does not validate against any of the Union subtypes")."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

from seqvae.errors import ConfigError


class Range(NamedTuple):
    """The values an option allows: `ok(value)`, and how the error line says it."""

    ok: Callable[[float], bool]
    text: str


POSITIVE = Range(lambda v: v > 0, "> 0")
NON_NEGATIVE = Range(lambda v: v >= 0, ">= 0")
AT_LEAST_ONE = Range(lambda v: v >= 1, ">= 1")
PROBABILITY = Range(lambda v: 0 <= v <= 1, "in [0, 1]")


def check_option(option: str, value, allowed: Range) -> None:
    """Refuses an out-of-range value in one line. None (options typed `| None`) always passes."""
    if value is not None and not allowed.ok(value):  # `not ok`: NaN fails every range too
        raise ConfigError(f"{option}: must be {allowed.text}, got {value}")


def check_strategy(option: str, strategy) -> None:
    """Checks the arguments a strategy object declares in `option_ranges` (a user's own class
    without one is not checked), naming them `<option>.init_args.<name>` as in a config."""
    for name, allowed in getattr(type(strategy), "option_ranges", {}).items():
        check_option(f"{option}.init_args.{name}", getattr(strategy, name), allowed)


def check_parsed(model, data) -> None:
    """The same checks on parsed options before anything is built (`seqvae sweep` checks each
    variant's arguments so before its first cell runs): `model` and `data` are the parsed
    sections (jsonargparse Namespaces); a strategy is its `class_path` and `init_args`."""
    for name, allowed in MODEL_OPTIONS.items():
        check_option(f"model.{name}", getattr(model, name, None), allowed)
    for name, allowed in DATA_OPTIONS.items():
        check_option(f"data.{name}", getattr(data, name, None), allowed)
    check_language_model(model)
    names = ("kl_schedule", "kl_penalty", "aggressive", "encoder", "feature_norm", "ais", "optimizer", "refine")
    strategies = {name: getattr(model, name, None) for name in names}
    strategies.update({f"regularizers[{i}]": r for i, r in enumerate(getattr(model, "regularizers", None) or [])})
    for option, spec in strategies.items():
        class_path = getattr(spec, "class_path", None)
        if class_path:
            module, _, name = class_path.rpartition(".")
            cls = getattr(importlib.import_module(module), name)
            args = getattr(spec, "init_args", None)
            for arg, allowed in getattr(cls, "option_ranges", {}).items():
                check_option(f"model.{option}.init_args.{arg}", getattr(args, arg, None), allowed)


# SeqVAE's numeric options (checked in its __init__).
MODEL_OPTIONS = {
    "embed_dim": AT_LEAST_ONE,
    "hidden_dim": AT_LEAST_ONE,
    # 0 would silently mean hidden_dim (`encoder_hidden_dim or hidden_dim`): null says that.
    "encoder_hidden_dim": Range(AT_LEAST_ONE.ok, ">= 1 (null: hidden_dim)"),
    "latent_dim": NON_NEGATIVE,  # 0: the LSTM language model (no encoder)
    # Probabilities, as torch's Dropout allows. 1 is meaningful for the decoder's inputs: the
    # inputless decoder of Bowman et al., which sees only z.
    "dropout_in": PROBABILITY,
    "dropout_out": PROBABILITY,
    "word_dropout": PROBABILITY,
    "lr": POSITIVE,  # SGD refuses lr < 0; lr 0 would train nothing
    # The clip coefficient is grad_clip / norm: 0 zeroes every update and a negative value
    # turns it into gradient ascent. .inf (YAML's infinity) turns clipping off.
    "grad_clip": Range(POSITIVE.ok, "> 0 (.inf: no clipping)"),
    "val_iw_samples": NON_NEGATIVE,  # 0: no IW-NLL
    "test_iw_samples": NON_NEGATIVE,
    "iw_max_elements": Range(AT_LEAST_ONE.ok, ">= 1 (null: automatic)"),
    # BN-VAE's fixed scale γ: the KL bound is Z·γ²/2, so 0 forces every posterior mean to the
    # learned shift and a negative γ only flips the means' sign. No upper limit: a larger γ
    # is a higher KL floor.
    "bn_gamma": Range(POSITIVE.ok, "> 0 (null: BN-VAE off)"),
    "bn_eps": POSITIVE,  # BatchNorm divides by sqrt(batch variance + ε)
}

# TextDataModule's (checked in its __init__): e.g. a negative batch size makes no batches and
# trains nothing.
DATA_OPTIONS = {
    "batch_size": AT_LEAST_ONE,
    "eval_batch_size": AT_LEAST_ONE,
    "num_workers": NON_NEGATIVE,
    "min_freq": NON_NEGATIVE,  # 0 is accepted: like 1, no cut-off
    "max_vocab": Range(AT_LEAST_ONE.ok, ">= 1 (null: no limit)"),
    "max_length": Range(AT_LEAST_ONE.ok, ">= 1 (null: no limit)"),
}


def _strategy_name(spec) -> str | None:
    """A strategy's class name, from a parsed `class_path` or an object; None when unset."""
    if spec is None:
        return None
    return str(getattr(spec, "class_path", None) or type(spec).__name__).rpartition(".")[2]


def check_language_model(model) -> None:
    """`latent_dim: 0` is the LSTM language model: no encoder, no z. An option that acts on z or
    on the encoder would be dropped while config.yaml records it (and compare shows it as a row):
    refused in one line, naming each, before anything is built. Word dropout acts on the decoder's
    inputs and stays."""
    if getattr(model, "latent_dim", None) != 0:
        return
    set_here = {
        "bn_gamma": getattr(model, "bn_gamma", None) is not None,
        "kl_penalty": _strategy_name(getattr(model, "kl_penalty", None)) not in (None, "StandardKL"),
        "skip": bool(getattr(model, "skip", False)),
        "regularizers": bool(getattr(model, "regularizers", None)),
        "init_encoder_from": bool(getattr(model, "init_encoder_from", None)),
        "aggressive": getattr(model, "aggressive", None) is not None,
        "encoder": getattr(model, "encoder", None) is not None,
        "feature_norm": getattr(model, "feature_norm", None) is not None,
        "encoder_hidden_dim": getattr(model, "encoder_hidden_dim", None) is not None,
    }
    named = [f"model.{k}" for k, v in set_here.items() if v]
    if named:
        raise ConfigError(
            f"model.latent_dim 0 is the language model (no encoder, no z), which {', '.join(named)} "
            f"{'needs' if len(named) == 1 else 'need'}: set {'it' if len(named) == 1 else 'them'} to null (skip: false), "
            "or give latent_dim > 0"
        )
