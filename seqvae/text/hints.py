"""One-line warnings about how a corpus is read: an unknown-token spelling that never occurs,
and a label format (`data.label_column`) that does not fit the file's lines; the data lines
every command prints (`report_data`)."""

from __future__ import annotations

import math
import os
import sys
from collections import Counter

from seqvae.text.corpus import Corpus, label_format

UNK_SPELLINGS = ("<unk>", "_UNK", "UNK", "<UNK>", "[UNK]", "@@UNKNOWN@@", "<oov>", "OOV")


def unk_token_hint(texts: list[list[str]], unk_token: str, known=None) -> str | None:
    """A one-line warning when the configured unknown token never occurs in the training text
    but another common spelling of it does (a corpus prepared with `<unk>` read with `_UNK`
    would make `<unk>` an ordinary word and report an unknown rate of 0); else None.
    `known` (scoring a checkpoint: its vocabulary's `token_to_id`): the text is a split scored
    with that vocabulary, whose unknown token no option changes; the line says what the other
    spelling is read as."""
    counts = Counter(tok for text in texts for tok in text if tok in UNK_SPELLINGS or tok == unk_token)
    if counts[unk_token]:
        return None
    found = [(c, w) for w, c in counts.items() if w != unk_token]
    if not found:
        return None
    n, word = max(found)
    if known is not None:
        read_as = "an ordinary word of the vocabulary" if known(word) is not None else "unknown, as a word outside it"
        return (
            f"the checkpoint's unknown token {unk_token!r} never occurs in this text, but {word!r} occurs {n} times: it "
            f"is read as {read_as} (the checkpoint's vocabulary decides; data.unk_token does not apply when scoring)"
        )
    return (
        f"data.unk_token is {unk_token!r}, which never occurs in the training text, but {word!r} occurs {n} times: "
        f"if {word!r} is this corpus's unknown token, set --data.unk_token '{word}'"
    )


def _looks_labelled(corpus: Corpus) -> str | None:
    """'`0`…`4` start 100% of lines' when at least 90% of the lines start with one of at most
    20 label-like tokens (digits, `__label__x`): a `label text` corpus; else None."""
    n = len(corpus.texts)
    values = sorted(corpus.first_tokens, key=lambda v: (-corpus.first_tokens[v], v))
    if n == 0 or corpus.n_first_label_like < 0.9 * n or len(values) > 20:
        return None
    shown = ", ".join(repr(v) for v in values[:5]) + (", …" if len(values) > 5 else "")
    share = f"{100 * corpus.n_first_label_like / n:.0f}%"
    return f"{share} of its {n} lines start with one of {len(values)} label-like tokens ({shown})"


MAX_LABELS = 50  # more distinct "labels" than this are words, not classes


def _lone_labels(corpus: Corpus) -> str | None:
    """`first_token` labels: the labels that occur on one line only, in a file whose commonest label
    occurs on 10 or more: most likely lines without their label, whose first word became one."""
    counts = Counter(corpus.labels)
    if not counts or max(counts.values()) < 10:
        return None
    lone = [(line, label) for label, line in zip(corpus.labels, corpus.line_numbers) if counts[label] == 1]
    if not lone:
        return None
    shown = ", ".join(f"{label!r} (line {line})" for line, label in lone[:3]) + (", …" if len(lone) > 3 else "")
    return (
        f"{corpus.path}: data.label_column is first_token but {len(lone)} label(s) occur on one line only, where "
        f"the others occur on up to {max(counts.values())}: {shown}; a line without its label has its first word "
        "read as one (and the word taken from its text)"
    )


def label_column_hint(corpus: Corpus, label_column) -> str | None:
    """A one-line warning when `data.label_column` looks wrong for this file, or for some of its
    lines: it is off but lines start with `label<TAB>` or with a label-like first token (the
    label would be read as the text's first word); it is `tab` but lines hold no tab (read as
    text with no label), or the part before the tab is not one short token (a tab inside the
    text: its first words would be dropped as a label); it is `first_token` but the first tokens
    take many values (words, not labels); else None. A file that mixes them is what a user's
    export script leaves behind."""
    n, path, labels = len(corpus.texts), corpus.path, label_format(label_column)
    if labels is None and corpus.n_label_like:
        return (
            f"{path}: {corpus.n_label_like} of {n} lines start with a label column "
            f"({corpus.first_label!r}<TAB>text, first at line {corpus.first_label_line}) that is read as "
            "the text's first word; if it is a label, set --data.label_column tab"
        )
    labelled = _looks_labelled(corpus)
    if labels is None:
        if labelled is None:
            return None
        return (
            f"{path}: {labelled}, read as the texts' first words; if they are labels (`label text`), "
            "set --data.label_column first_token"
        )
    if labels == "first_token":
        distinct = len(set(corpus.labels))
        if distinct <= MAX_LABELS:
            return _lone_labels(corpus)
        return (
            f"{path}: data.label_column is first_token but the first tokens take {distinct} values (more than "
            f"{MAX_LABELS}: words, not class labels): each text loses its first word; if the file has no labels, "
            "set --data.label_column false"
        )
    if corpus.n_tab == 0:
        also = f"; {labelled}: if they are labels, set --data.label_column first_token" if labelled else ""
        return f"{path}: data.label_column is tab but no line holds a tab: every line is read as text, none has a label{also}"
    problems = []  # a file can have both: each is said, in the one line
    if corpus.n_tab < n:
        problems.append(
            f"{n - corpus.n_tab} of {n} lines hold no tab (first at line {corpus.first_untabbed_line}): "
            "they are read as text with no label"
        )
    if corpus.n_blank_label:
        problems.append(
            f"{corpus.n_blank_label} of {n} lines have nothing before the tab (first at line "
            f"{corpus.first_blank_label_line}): they are read as text with no label"
        )
    if corpus.n_odd_label:
        problems.append(
            f"on {corpus.n_odd_label} of {n} lines the part before the tab is not one short label (first at line "
            f"{corpus.first_odd_label_line}): it is dropped as the label; if the tab is part of the text, set "
            "--data.label_column false"
        )
    return f"{path}: data.label_column is tab but {'; and '.join(problems)}" if problems else None


def data_line(split: str, s: dict) -> str:
    """What `fit`, `test` and `predict` print about each split they read (`summary()` values)."""
    where = f"{s['file']} lines {s['lines']}" + (f", labels {s['label_column']}" if s.get("label_column") else "")
    return (
        f"seqvae: {split}: {s['texts']} texts ({where}), {s['predicted_tokens']} predicted tokens, "
        f"unk {100 * s['unk_rate']:.2f}%, {s['empty_lines_skipped']} empty and {s['too_long_skipped']} too-long lines skipped"
    )


def long_text_hint(corpus: Corpus) -> str | None:
    """A warning when a split's longest text is an outlier: over 500 tokens and more than 5 times
    the 90th percentile of its texts' lengths (the 99th from 1,000 texts on; below that the top
    1% is one or two texts, which may be the outliers themselves): a file with a line that never
    broke (8,631 tokens among verses of ~30). Its batch is padded to it (time and memory grow
    with it) and its NLL weighs on the per-text mean; nothing said so before."""
    lengths = sorted(len(text) for text in corpus.texts)
    if len(lengths) < 20:
        return None
    q = 0.99 if len(lengths) >= 1000 else 0.9
    typical = lengths[int(q * (len(lengths) - 1))]
    longest = lengths[-1]
    if longest <= 500 or longest <= 5 * typical:
        return None
    outliers = sorted(
        (i for i, text in enumerate(corpus.texts) if len(text) > 500 and len(text) > 5 * typical),
        key=lambda i: -len(corpus.texts[i]),
    )
    where = corpus.line_numbers[outliers[0]] if corpus.line_numbers else None
    line = f"line {where} of {corpus.path}" if where is not None else f"a text of {corpus.path}"
    others = sorted(corpus.line_numbers[i] for i in outliers[1:]) if corpus.line_numbers else []
    also = f" (and {len(others)} more such line(s): {', '.join(map(str, others[:5]))}{', …' if len(others) > 5 else ''})"
    return (
        f"{line} has {longest} tokens, {longest / typical:.0f}× the {q * 100:.0f}th percentile of its texts ({typical})"
        f"{also if others else ''}: "
        f"its batch is padded to it (time, memory) and its NLL weighs on the per-text mean; --data.max_length "
        f"{max(2 * typical, 1)} skips such lines"
    )


def unk_rate_hint(split: str, s: dict, train_rate: float | None) -> str | None:
    """A warning when an evaluation split has far more unknown tokens than the training text had
    (a checkpoint scored on another corpus: its IW-NLL is mostly the unknown token's): more than
    twice the training rate and at least 5 points above it; or any unknown tokens at all when the
    training text had none (a raw corpus with `min_freq: 1`, `max_vocab: null`): the model never
    learned the unknown token, and such words cost whatever its untaught output gives them."""
    if train_rate == 0 and s["unk_rate"] > 0:
        count = round(s["unk_rate"] * s["tokens"])
        return (
            f"data.{split}: {count} of its {s['tokens']} tokens ({percent(s['unk_rate'])}) are unknown to the vocabulary, "
            "and the training text had none: the model never learned the unknown token, only that it never occurs, so "
            "each such word costs many nats (train with a --data.min_freq that leaves some training words out, or a "
            "--data.max_vocab, so that training sees unknown words)"
        )
    if train_rate is None or s["unk_rate"] <= max(2 * train_rate, train_rate + 0.05):
        return None
    return (
        f"data.{split}: {100 * s['unk_rate']:.2f}% of its tokens are unknown to the vocabulary, against "
        f"{100 * train_rate:.2f}% of the training text: another corpus, another unknown token or too little training "
        "text? Each such word is read, and scored, as the unknown token"
    )


def percent(rate: float) -> str:
    """A share as a percentage with two significant digits, never in e-notation (`1e+02%` for
    all of them) and never rounded to 100% or 0% unless it is."""
    if rate in (0, 1):
        return f"{100 * rate:.0f}%"
    digits = max(0, 1 - math.floor(math.log10(100 * rate))) if rate < 0.1 else 0
    shown = f"{100 * rate:.{digits}f}"
    return f"{'>99' if float(shown) >= 100 else shown}%"


def fallback_warnings(splits: dict, given: dict) -> list[str]:
    """One line for each evaluation split that was not given and is therefore the training split
    itself (`TextDataModule.splits`); `given`: {split: whether data.<split> was set}. A split set
    to the training file is what the user asked for, and is not said to be missing."""
    uses = {"val": "validation and the choice of the best checkpoint", "test": "the test metrics"}
    return [
        f"data.{split} is not given: {use} read the training texts; give --data.{split} FILE or FILE#FIRST-LAST"
        for split, use in uses.items()
        if not given[split] and splits[split] == splits["train"] and splits["train"] is not None
    ]


def token_warnings(corpus: Corpus, s: dict) -> list[str]:
    """The training text's warnings about how it was split into words: nearly every line one
    token (text without spaces, as Chinese or Japanese: each line becomes one "word" of the
    vocabulary and nothing is learnt), and most of its tokens unknown to the vocabulary (then
    the model learns little but the unknown token, and its NLL says little about the text)."""
    out = []
    n = len(corpus.texts)
    single = sum(len(text) == 1 for text in corpus.texts)
    if n >= 20 and single >= 0.9 * n:
        out.append(
            f"data.train: {single} of the {n} texts of {corpus.path} are one token: seqvae splits text on whitespace, so a text "
            "without spaces (Chinese, Japanese, …) is one word of the vocabulary; tokenise such a corpus first, "
            "one text per line with spaces between tokens (docs/data.md)"
        )
    if s["unk_rate"] > 0.25:
        out.append(
            f"data.train: {percent(s['unk_rate'])} of its tokens are unknown to the vocabulary: the model learns little "
            "but the unknown token, and its NLL says little about the text (a --data.min_freq or --data.max_vocab that "
            "leaves out most words, another corpus's --data.vocab, or text not split into words)"
        )
    return out


def report_data(trainer, dm, splits: tuple[str, ...], note: str | None = None) -> None:
    """The data lines `fit`, `validate`, `test` and `predict` print (rank 0) for the splits they
    read: texts, tokens, unk rate, skipped lines; the warnings of a split read with another unknown
    token or from another corpus; with `train`, those of evaluation splits that are the training text.
    `note`: a line said before the run directory's (where a command writes beside a finished run)."""
    if not trainer.is_global_zero or not splits:
        return
    summary = dm.summary()
    warned = []  # splits may share one corpus (val = train)
    for split in splits:
        print(data_line(split, summary[split]), file=sys.stderr)
        corpus = dm.corpora.get(split) if split in ("train", "val", "test") else None  # predict reads its file whole
        if corpus is not None and all(corpus is not c for c in warned):
            warned.append(corpus)
            hint = long_text_hint(corpus)
            if hint is not None:
                print(f"seqvae: warning: data.{split}: {hint}", file=sys.stderr)
    if "train" not in splits:  # scoring a checkpoint: its vocabulary's unknown token
        for split in splits:
            dm.unk_hint(split)
    train_rate = summary["train"]["unk_rate"] if "train" in summary else (dm.vocab.reading or {}).get("train_unk_rate")
    for split in splits:
        hint = unk_rate_hint(split, summary[split], train_rate) if split != "train" else None
        if hint is not None:
            print(f"seqvae: warning: {hint}", file=sys.stderr)
    if note:
        print(note, file=sys.stderr)
    seed = os.environ.get("PL_GLOBAL_SEED")  # what seed_everything set (Lightning's own line is silenced: cli.py)
    seed = f"seed {seed}; " if seed is not None else ""
    print(f"seqvae: vocabulary {dm.vocab_size} ids; {seed}run directory {trainer.log_dir}", file=sys.stderr)
    if "train" not in splits:
        return
    given = {
        split: dm.hparams.get(split) is not None or dm.hparams.get(f"{split}_lines") is not None for split in ("val", "test")
    }
    for line in fallback_warnings(dm.splits, given) + token_warnings(dm.corpora["train"], summary["train"]):
        print(f"seqvae: warning: {line}", file=sys.stderr)
