"""What each `--config` file and each run of command-line flags sets, in the order jsonargparse
applies them: so that a split's file and its lines are resolved where they were written together,
and a split left behind by a replaced training file is said, not silently evaluated.

jsonargparse merges the sources into one config and forgets where a key came from; a range
written beside one file (`train_lines: 1-8000` in yahoo10k's base config, the older form) would
be applied to the file a later overlay or flag names. Here each source is read on its own.
Torch-free (YAML and the argument list only).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from seqvae.errors import ConfigError, CorpusError
from seqvae.text.splits import parse_line_range, parse_split, split_value

SPLITS = ("train", "val", "test")
COMMAND_LINE = "the command line"


def config_files(argv: list[str]) -> list[str]:
    """The `--config` files of an argument list, in order."""
    given = []
    for i, a in enumerate(argv):
        if a in ("--config", "-c") and i + 1 < len(argv):
            given.append(argv[i + 1])
        elif a.startswith("--config="):
            given.append(a.split("=", 1)[1])
    return given


class DuplicateKey(yaml.MarkedYAMLError):
    def __init__(self, key, mark, first):
        problem = f"key {key!r} given twice (first at line {first.line + 1}): the later one would silently replace it"
        super().__init__(problem=problem, problem_mark=mark)


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's own loaders keep the last of two equal keys of a mapping without a word: two `model:` blocks in one
    file lost the first block's settings (found by a new-user walkthrough). This one refuses them."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged by the base class
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)):
                if key in seen:
                    raise DuplicateKey(key, key_node.start_mark, seen[key])
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


def load_yaml(path: str):
    """A `--config` file's content; a YAML syntax error, or a key given twice in one mapping, names the file, line
    and column (jsonargparse reports a syntax error as found in "<unicode string>" and keeps a repeated key's last value)."""
    try:
        return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"--config {path}{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None


def check_config_files(argv: list[str]) -> None:
    for path in config_files(argv):
        if Path(path).is_file():  # jsonargparse's own error names a missing file
            load_yaml(path)


def file_setting(argv: list[str], key: str) -> str | None:
    """The last `--config` file that sets this dotted key (`data.trian`), for naming the file
    in an unknown-key error (jsonargparse's message names the key only)."""
    found = None
    for path in config_files(argv):
        node = load_yaml(path) if Path(path).is_file() else None
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is not KeyError:
            found = path
    return found


def set_by_user(argv: list[str], key: str) -> bool:
    """Whether the command line (`--model.latent_dim 8`, `--model.kl_penalty.target=2`) or a
    `--config` file sets this dotted key: a default nobody wrote is not the user's setting."""
    flag = f"--{key}"
    return any(a == flag or a.startswith((f"{flag}=", f"{flag}.")) for a in argv) or file_setting(argv, key) is not None


def _yaml_value(text: str):
    """A flag's value as jsonargparse reads it: `null` is None."""
    return None if text in ("null", "None", "~") else text


def data_sources(argv: list[str]) -> list[tuple[str, dict]]:
    """[(source, {"train": …, "train_lines": …, …})]: the data keys each source sets, in order.
    A `--config` file is one source; consecutive `--data.*` flags are one (a flag and its range
    written side by side, `--data.test F --data.test_lines 3-7`, go together)."""
    out: list[tuple[str, dict]] = []
    flags: dict = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--config", "-c") or a.startswith("--config="):
            if flags:
                out.append((COMMAND_LINE, flags))
                flags = {}
            path = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in a else 2
            content = load_yaml(path) if Path(path).is_file() else None
            data = content.get("data") if isinstance(content, dict) else None
            if isinstance(data, dict):
                out.append((f"--config {path}", {k: data[k] for k in data if k.split("_lines")[0] in SPLITS}))
            continue
        if a.startswith("--data."):
            key, has_value, value = a[len("--data.") :].partition("=")
            if not has_value:
                value = argv[i + 1] if i + 1 < len(argv) else None
                i += 1
            if key.split("_lines")[0] in SPLITS:
                flags[key] = _yaml_value(value) if isinstance(value, str) else value
        i += 1
    if flags:
        out.append((COMMAND_LINE, flags))
    return out


@dataclass
class Split:
    path: str
    lines: tuple[int, int] | None
    source: str  # where the file was named
    beside_train: str | None = None  # the training file of that source, if it named one

    def value(self) -> str:
        return split_value(self.path, self.lines)


def resolve(sources: list[tuple[str, dict]]) -> tuple[dict[str, Split | None], bool]:
    """Each split's file and lines, combined within the source that wrote them; an unset val/test
    is None (the training split). Also whether the older `*_lines` keys were used."""
    state: dict[str, Split | None] = dict.fromkeys(SPLITS)
    old_form = False
    for source, keys in sources:
        for split in SPLITS:
            if split not in keys and f"{split}_lines" not in keys:
                continue
            option = f"data.{split}"
            try:
                lines = parse_line_range(keys.get(f"{split}_lines"))
                parsed = parse_split(keys[split]) if split in keys else None
            except CorpusError as err:
                raise ConfigError(f"{option} ({source}): {err}") from None
            old_form |= lines is not None
            if split in keys:
                if parsed is not None and parsed[1] is not None and lines is not None:
                    raise ConfigError(f"{option}_lines ({source}): {keys[split]!r} gives its lines already; give one of them")
                train_here = keys.get("train") if split != "train" else None
                state[split] = None if parsed is None else Split(parsed[0], parsed[1] or lines, source, train_here)
                continue
            current = state[split] or (state["train"] if split != "train" else None)
            if current is None:
                if lines is None:
                    continue
                why = f"a line range but no data.{split} or data.train file to take it from"
                raise ConfigError(f"{option}_lines ({source}): {why}")
            # A range without a file: of the split's current file (for val/test without one of
            # their own, the training file as it stands after this source, as the older form meant).
            state[split] = Split(current.path, lines, source, current.path if split != "train" else None)
    return state, old_form


def left_behind(state: dict[str, Split | None], sources: list[tuple[str, dict]]) -> list[str]:
    """Warnings for val/test splits named beside a training file that a later source replaced:
    `data: {train: mine.txt}` over yahoo10k's base config still validates and tests on Yahoo."""
    train = state["train"]
    out = []
    for split in ("val", "test"):
        s = state[split]
        if train is None or s is None or s.beside_train is None or s.source == train.source:
            continue
        named_with = (parse_split(s.beside_train) or (None,))[0]
        if named_with is None or named_with == train.path:
            continue
        out.append(
            f"data.{split} reads {s.value()} ({s.source}, beside data.train {named_with}), but data.train is now "
            f"{train.value()} ({train.source}): give data.{split} for your file too (null: the training texts themselves)"
        )
    return out


def settle_splits(data, argv: list[str]) -> list[str]:
    """Rewrites the parsed `data` section so each split is one value (`FILE#FIRST-LAST`), its range
    taken only from the source that named its file; returns the lines to print (notes and
    warnings). Where a source could not be traced (another spelling of the flags), the merged
    values are kept as they are."""
    sources = data_sources(argv)
    state, old_form = resolve(sources)
    merged = {k: data.get(k) for k in (*SPLITS, *(f"{s}_lines" for s in SPLITS))}
    try:
        if merged["train"] is not None and (state["train"] is None or parse_split(merged["train"])[0] != state["train"].path):
            return []  # a source we do not read (e.g. `--data '{…}'`): jsonargparse's values stand
    except CorpusError:
        return []  # the datamodule says what is wrong with the value, naming the option
    lines = []
    if old_form or any(merged[f"{s}_lines"] is not None for s in SPLITS):
        for split in SPLITS:
            data[split] = state[split].value() if state[split] is not None else None
            data[f"{split}_lines"] = None
        read_as = ", ".join(f"data.{s}: {data[s]}" for s in SPLITS if data[s] is not None)
        note = f"data.*_lines is the older form of a split's range: read as {read_as} (write FILE#FIRST-LAST)"
        lines.append(f"seqvae: note: {note}")
    lines += [f"seqvae: warning: {w}" for w in left_behind(state, sources)]
    return lines


LIMITS = tuple(f"limit_{stage}_batches" for stage in ("train", "val", "test", "predict"))


def integer_limits(argv: list[str]) -> dict[str, int]:
    """`trainer.limit_*_batches` written as an integer (`1`) in a `--config` file or a flag, which
    jsonargparse reads as the float 1.0 (Lightning's type lists float first), and Lightning then
    as 100% of the batches: a 'one batch' smoke test ran whole epochs. {key: the int written}."""
    found: dict[str, int] = {}
    for i, a in enumerate(argv):
        if a in ("--config", "-c") or a.startswith("--config="):
            path = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
            content = load_yaml(path) if Path(path).is_file() else None
            trainer = content.get("trainer") if isinstance(content, dict) else None
            for key in LIMITS:
                value = trainer.get(key) if isinstance(trainer, dict) else None
                if isinstance(value, float) or (value is None and isinstance(trainer, dict) and key in trainer):
                    found.pop(key, None)
                elif isinstance(value, int) and not isinstance(value, bool):
                    found[key] = value
        for key in LIMITS:
            flag = f"--trainer.{key}"
            if a == flag or a.startswith(flag + "="):
                text = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
                if text.strip().lstrip("+").isdigit():
                    found[key] = int(text)
                else:
                    found.pop(key, None)
    return found


def settle_seeds(cfg) -> None:
    """Seeds left unset (`data.seed`, `model.aggressive.init_args.seed`) take the run's seed
    (`seed_everything`; 0 where it is not a number), written into the parsed config so that
    config.yaml records the values the run used."""
    seed = cfg.get("seed_everything")
    if not isinstance(seed, int) or isinstance(seed, bool):
        seed = 0
    if cfg.get("data") is not None and cfg["data"].get("seed") is None:
        cfg["data"]["seed"] = seed
    aggressive = cfg["model"].get("aggressive") if cfg.get("model") is not None else None
    if aggressive is not None and aggressive.get("init_args") is not None and aggressive["init_args"].get("seed") is None:
        aggressive["init_args"]["seed"] = seed
