"""What validate/test/predict of a checkpoint record (issue 45): the settings the checkpoint
decides are recorded as the checkpoint's values, and a command that gave others is told so in
one line, instead of config.yaml (and compare's row labels) naming values that did not run.

The checkpoint's hyper-parameters replace the model's config, as Lightning's CLI does, except
the evaluation keys (`EVAL_KEYS`; `checkpoint_into_config`); the vocabulary, and with it the
unknown token, comes from the checkpoint (`data.vocab`), so `data.unk_token` is the checkpoint's too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from seqvae.store.checkpoints import load_checkpoint, require_run_checkpoint, share

# Evaluation settings, not part of what a checkpoint is: on `--ckpt_path` (validate, test, predict), Lightning
# replaces the model's config with the checkpoint's hyper-parameters, which would silently evaluate with the K
# the run was trained with. These keys keep the value of this command's config (--config files, --model.*).
EVAL_KEYS = ("val_iw_samples", "test_iw_samples", "iw_max_elements", "mi_dataset", "eval_seed", "ais")


def checkpoint_into_config(parser, config):
    """`--ckpt_path` as the CLI parses it: the file is read here, once for the whole command
    (`share`; a code-carrying file refused in one line), and for validate/test/predict its
    hyper-parameters replace the model's config (LightningCLI's `_parse_ckpt_path`, reading that
    one copy) but for `EVAL_KEYS`; `fit` resumes with the command's settings, refused where they
    differ (training/resume.py). Returns (the config, the model section as the command gave it)."""
    sub = config.get("subcommand")
    model = config[sub].get("model") if sub else None
    given = model.clone() if model is not None else None  # before the checkpoint's values replace it
    ckpt = config[sub].get("ckpt_path") if sub else None
    if not ckpt or not Path(ckpt).is_file():
        return config, given
    share(ckpt)
    saved = require_run_checkpoint(load_checkpoint(ckpt, "ckpt_path"), ckpt, "ckpt_path")
    hparams = dict(saved.get("hyper_parameters", {}))  # a copy: the read is shared
    hparams.pop("_instantiator", None)
    if sub == "fit" or not hparams:
        return config, given
    if "_class_path" in hparams:
        hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
    keep = {k: model.get(k) for k in EVAL_KEYS if k in model} if model is not None else {}
    try:
        config = parser.parse_object({sub: {"model": hparams}}, config)
    except SystemExit:
        sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
        raise
    for k, v in keep.items():
        config[sub]["model"][k] = v
    return config, given


def _shown(value) -> str:
    init = getattr(value, "init_args", None)
    if getattr(value, "class_path", None):
        args = ", ".join(f"{k}={v}" for k, v in vars(init).items()) if init is not None else ""
        return f"{value.class_path.rpartition('.')[2]}({args})"
    return "null" if value is None else str(value)


def record_checkpoint_settings(cfg, set_by_user: Callable[[str], bool], given_model) -> None:
    """`cfg` (validate/test/predict, parsed and settled) takes the checkpoint's vocabulary
    (`data.vocab`: the training text is not needed) and unknown token; `given_model` is the
    model section as the command gave it, before Lightning put the checkpoint's values in;
    `set_by_user(key)`: the command line or a --config file set that dotted key. Prints one line
    naming each key the user set to another value than the checkpoint's."""
    data, ckpt = cfg.get("data"), cfg.get("ckpt_path")
    if data is None or not ckpt or not Path(ckpt).is_file():
        return
    decided = []
    saved = load_checkpoint(ckpt, "ckpt_path", mmap=True)
    if data.get("vocab") is None and "vocab" in saved:
        data["vocab"] = str(ckpt)
        unk = json.loads(saved["vocab"])["unk_token"]
        if data.get("unk_token") != unk:
            if set_by_user("data.unk_token"):
                decided.append(f"data.unk_token ({_shown(data.get('unk_token'))} given, {unk} used)")
            data["unk_token"] = unk
    model = cfg.get("model")
    for key in vars(given_model) if given_model is not None and model is not None else ():
        given, used = given_model.get(key), model.get(key)
        if key != "generation" and given != used and set_by_user(f"model.{key}"):
            decided.append(f"model.{key} ({_shown(given)} given, {_shown(used)} used)")
    if decided:
        print(
            f"seqvae: the checkpoint decides {', '.join(decided)}: config.yaml records the checkpoint's values", file=sys.stderr
        )
