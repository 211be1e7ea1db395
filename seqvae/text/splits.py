"""A split of a corpus as one value: its file and its lines together (`FILE` or
`FILE#FIRST-LAST`), and how a run's three splits are resolved from it, including the older form
of two keys (`train` + `train_lines`) that configs written before it use.
"""

from __future__ import annotations

import re
from pathlib import Path

from seqvae.errors import ConfigError, CorpusError


def parse_line_range(spec: str | list[int] | tuple[int, int] | None) -> tuple[int, int] | None:
    """'1-8000' or [1, 8000] -> (1, 8000), 1-based and inclusive."""
    if spec is None:
        return None
    if isinstance(spec, str):
        parts = spec.replace(":", "-").split("-")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise CorpusError(f"line range {spec!r}: expected 'FIRST-LAST', e.g. '1-8000'")
        spec = (int(parts[0]), int(parts[1]))
    first, last = int(spec[0]), int(spec[1])
    if first < 1 or last < first:
        raise CorpusError(f"line range {first}-{last}: need 1 <= FIRST <= LAST")
    return first, last


SPLIT_RANGE = re.compile(r"^(?P<path>.*)#(?P<first>\d+)\s*[-:]\s*(?P<last>\d+)$")


def parse_split(spec: str | Path | None) -> tuple[str, tuple[int, int] | None] | None:
    """A split as one value, its file and its lines together: 'FILE' (every line) or
    'FILE#FIRST-LAST' (1-based, inclusive), e.g. '../shared/data/yahoo/valid.txt#1-8000'.

    One value, so that replacing the file (a flag, an overlay config, a sweep variant) cannot
    keep another file's range, as two keys (`train` and `train_lines`) could. A '#' not followed
    by a range is part of the file name only if that file exists."""
    if spec is None:
        return None
    spec = str(spec)
    match = SPLIT_RANGE.match(spec)
    if match:
        return match["path"], parse_line_range((int(match["first"]), int(match["last"])))
    if "#" in spec and not Path(spec).exists():
        raise CorpusError(f"{spec!r}: expected FILE or FILE#FIRST-LAST (e.g. train.txt#1-8000)")
    return spec, None


def split_value(path: str, lines: tuple[int, int] | None) -> str:
    """The inverse of `parse_split`."""
    return f"{path}#{lines[0]}-{lines[1]}" if lines else str(path)


def resolve_splits(train, val, test, train_lines=None, val_lines=None, test_lines=None) -> dict:
    """{split: (file, line range or None) or None}: each split's file and lines. An unset val/test
    is the training split itself. The older keys `*_lines` are folded in: `train_lines` is a
    range of `train`; `val_lines` one of `val`, or of the training file where `val` is unset."""
    out = {}
    for split, spec, lines in (("train", train, train_lines), ("val", val, val_lines), ("test", test, test_lines)):
        try:
            parsed = parse_split(spec)
            extra = parse_line_range(lines)
        except CorpusError as err:
            raise CorpusError(f"data.{split}{'_lines' if lines is not None and spec is None else ''}: {err}") from None
        if extra is not None:
            if parsed is not None and parsed[1] is not None:
                raise ConfigError(f"data.{split}_lines: data.{split} {spec!r} gives its lines already; give one of them")
            base = parsed if parsed is not None else out.get("train")
            if base is None:
                raise ConfigError(f"data.{split}_lines: a line range but no data.{split} or data.train file to take it from")
            parsed = (base[0], extra)
        out[split] = parsed if parsed is not None else out.get("train")
    return out


def fold_split_keys(flat: dict) -> None:
    """A run's flattened config (`data.train`, `data.train_lines`, …) with each split as one value,
    in place: a run written in the older form groups with the same run written in the new one
    (`seqvae compare`). A val/test split left unset (the training split stands in) is None; one set
    to the training file is that file, as the run's record has it."""
    names = [f"data.{s}" for s in ("train", "val", "test")]
    if not any(k in flat for k in names):
        return
    lines = [flat.pop(f"{k}_lines", None) for k in names]
    try:
        splits = resolve_splits(*(flat.get(k) for k in names), *lines)
    except (ConfigError, CorpusError):
        return
    given = [flat.get(k) is not None or line is not None for k, line in zip(names, lines)]
    for key, split, set_by_user in zip(names, ("train", "val", "test"), given):
        value = splits[split]
        shown = value is not None and (split == "train" or set_by_user or value != splits["train"])
        flat[key] = split_value(*value) if shown else None
