"""A resume (`seqvae fit … --ckpt_path last|PATH`) runs the settings the checkpoint's run started
with, or is refused in one line before anything is read or written.

The checkpoint records the run's model and data settings (`hyper_parameters`,
`datamodule_hyper_parameters`); the run directory's config.yaml the rest (optimiser schedule,
checkpoint selection, seed, trainer). A setting that changes what is computed may not differ: a
resumed run would otherwise train the second part with other settings than its records say
(issue 45: `--model.pooling avg --model.lr 0.1` on resume gave a best.ckpt that said avg/0.1 and a
config.yaml that said max/1.0). The settings in `MAY_CHANGE` (when to stop, logging, progress,
evaluation-only options) may differ; config.yaml then records the resumed command's values
(rundir/run_dir_callbacks.py: RunDirConfig), and docs/usage.md lists them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from seqvae.errors import ConfigError
from seqvae.store.checkpoints import load_checkpoint
from seqvae.store.files import CONFIG
from seqvae.text.corpus import Vocabulary
from seqvae.training.retest import EVAL_KEYS

# Dotted keys, or sections (a key and everything under it), that a resume may change.
MAY_CHANGE = (
    "ckpt_path",
    "weights_only",
    # when to stop
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.max_time",
    "trainer.min_epochs",
    "trainer.min_steps",
    # logging, progress and where the run is written
    "trainer.logger",
    "trainer.log_every_n_steps",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.default_root_dir",
    "trainer.num_sanity_val_steps",
    "trainer.limit_test_batches",
    "trainer.limit_predict_batches",
    "periodic_checkpoint",
    "text_samples",
    "latent_dimensions",
    # evaluation only: the keys that keep the command's value when a checkpoint is scored (taken from
    # retest.EVAL_KEYS, so a key added there is resumable too: a copy here once missed model.ais)
    *(f"model.{key}" for key in EVAL_KEYS),
    "model.generation",
    "data.test",
    "data.test_lines",
    "data.predict",
    "data.eval_batch_size",
    "data.num_workers",
    # the vocabulary is compared word by word (same_vocabulary)
    "data.vocab",
)


SHOWN = 8  # refused keys named in the line (a resume without the run's --config files differs in dozens)


def may_change(key: str) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in MAY_CHANGE)


def flatten(tree, prefix: str = "") -> dict:
    """Nested dicts as dotted keys; lists and other values as they are."""
    if not isinstance(tree, dict) or (prefix and not tree):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _same(a, b) -> bool:
    # The datamodule records "no label column" as False, a config as null.
    if {type(a), type(b)} <= {type(None), bool} and not a and not b:
        return True
    return a == b and isinstance(a, bool) == isinstance(b, bool)  # 0 == False in Python: not the same setting


def _value(flat: dict, key: str):
    """A key's value, or, for a section (`kl_penalty.class_path`, …), its class or its keys."""
    if key in flat:
        return flat[key]
    below = {k[len(key) + 1 :]: v for k, v in flat.items() if k.startswith(f"{key}.")}
    return str(below["class_path"]).rpartition(".")[2] if "class_path" in below else below


def differences(now: dict, recorded: dict) -> dict[str, tuple]:
    """{key: (recorded, now)} for every setting whose value differs, as flat dotted keys. A key one
    side lacks counts when the other side has it at another depth (`kl_penalty: null` against
    `kl_penalty.class_path: …`); a key only one side knows at all (another seqvae's) does not."""
    out = {}
    for key in now.keys() | recorded.keys():
        if key in now and key in recorded:
            if not _same(now[key], recorded[key]):
                out[key] = (recorded.get(key), now.get(key))
            continue
        here, there = (now, recorded) if key in now else (recorded, now)
        for other in there:
            if key.startswith(f"{other}.") and other not in here:
                out[other] = (_value(recorded, other), _value(now, other))
            elif other.startswith(f"{key}.") and key not in there:
                out[key] = (_value(recorded, key), _value(now, key))
    return out


def check_resume(parser, cfg, ckpt: str) -> None:
    """Refuses a resume whose settings differ from the checkpoint's run where that changes what is
    computed, naming the keys; prints one line naming the allowed changes (config.yaml records
    them). `parser` is the fit subcommand's parser, `cfg` its parsed, settled config, `ckpt` the
    checkpoint file (`last` resolved)."""
    ckpt = Path(ckpt)
    saved = load_checkpoint(ckpt, "ckpt_path", mmap=True)
    config_yaml = ckpt.parent.parent / CONFIG  # the run directory's record of the rest
    recorded = yaml.safe_load(config_yaml.read_text(encoding="utf-8")) if config_yaml.is_file() else {}
    recorded = flatten(recorded or {})
    for section, key in (("model", "hyper_parameters"), ("data", "datamodule_hyper_parameters")):
        hparams = {k: v for k, v in (saved.get(key) or {}).items() if k not in ("_instantiator", "vocab_size")}
        recorded.update(flatten({section: hparams}) if hparams else {})
    now = flatten(yaml.safe_load(parser.dump(cfg, skip_none=False, skip_check=True)))
    changed = differences(now, recorded)
    refused = sorted(k for k in changed if not may_change(k))
    if refused:
        shown = ", ".join(f"{k} {_text(changed[k][0])} -> {_text(changed[k][1])}" for k in refused[:SHOWN])
        shown += f" and {len(refused) - SHOWN} more" if len(refused) > SHOWN else ""
        raise ConfigError(
            f"ckpt_path: {ckpt} was trained with other settings than this command gives: {shown}; resume with the "
            "run's own settings (its config.yaml), or start a new run"
        )
    allowed = sorted(k for k in changed if k not in ("ckpt_path", "weights_only"))
    if allowed:
        shown = ", ".join(f"{k} {_text(changed[k][0])} -> {_text(changed[k][1])}" for k in allowed)
        print(f"seqvae: resuming {ckpt} with {shown} (config.yaml records the new values)", file=sys.stderr)


def same_vocabulary(ckpt: str, vocab: Vocabulary) -> None:
    """Resuming with other training text builds another vocabulary, whose embedding sizes
    cannot load the checkpoint's weights: one line instead of a state-dict size mismatch."""
    saved = load_checkpoint(ckpt, "ckpt_path", mmap=True).get("vocab")
    saved = Vocabulary.from_str(saved).tokenizer.get_vocab() if saved is not None else None
    now = vocab.tokenizer.get_vocab()
    if saved is not None and saved != now:
        moved = sum(1 for word, i in saved.items() if now.get(word) != i)  # missing, or at another id
        raise ConfigError(
            f"ckpt_path: {ckpt} was trained with another vocabulary ({len(saved)} ids) than data.train gives now "
            f"({len(now)} ids; {moved} of the checkpoint's words missing or at other ids): resume with the "
            "training data (and data.* options) the run started with"
        )


def _text(value) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
