"""Corpora and vocabulary: reading one-text-per-line files, the word-level vocabulary (HF
`tokenizers` WordLevel), id sequences and their batches. A saved run's vocabulary is read from its vocab.json or a
checkpoint (`load_vocabulary`, through the one loader: as data, never as code).

A corpus is one text per line, already tokenised (split on whitespace), optionally
`label<TAB>text` (Yelp). Every sequence becomes `<s> w1 … wn </s>`; the decoder reads
`<s> … wn` and predicts `w1 … </s>` (n + 1 predicted tokens).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit

from seqvae.errors import ConfigError, CorpusError  # noqa: F401  (seqvae.corpus.CorpusError: where they were first defined)
from seqvae.store.checkpoints import load_checkpoint
from seqvae.text.splits import parse_line_range

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def run_seed() -> int:
    """The run's seed, `seed_everything` (Lightning exports it as PL_GLOBAL_SEED); 0 if none
    was set. Every seed left unset defaults to it, so that a run's seed varies everything."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


@dataclass
class Corpus:
    texts: list[list[str]]
    labels: list[str | None]
    path: str
    n_empty: int = 0  # empty / whitespace-only lines, skipped
    n_too_long: int = 0  # lines longer than max_length tokens, skipped
    line_numbers: list[int] = field(default_factory=list)  # 1-based, of each kept text
    n_tab: int = 0  # kept lines holding a tab
    n_label_like: int = 0  # ... whose part before the first tab is one short token (`5<TAB>text`)
    first_label: str | None = None  # that token on the first such line
    first_label_line: int | None = None  # ... and its line number
    first_untabbed_line: int | None = None  # the first kept line with no tab
    n_odd_label: int = 0  # kept lines with a tab whose part before it is not one short token
    first_odd_label_line: int | None = None
    n_blank_label: int = 0  # kept lines with a tab and nothing before it (`<TAB>text`): no label
    first_blank_label_line: int | None = None
    lines_read: tuple[int, int] = (1, 0)  # the 1-based, inclusive span of file lines read
    # The first whitespace-separated token of each kept line (before any label is taken off),
    # counted where it looks like a class label (`3`, `-1`, `__label__pos`): a `label text`
    # corpus read without labels shows as most lines starting with a handful of such values.
    first_tokens: Counter = field(default_factory=Counter)
    n_first_label_like: int = 0


LABEL_MAX_CHARS = 32  # a class label, not a text: `5`, `pos`, `__label__sports`
LABEL_LIKE = re.compile(r"^(?:[+-]?\d{1,3}|__label__\S+)$")  # a first token that looks like a label


def texts_digest(texts: list[list[str]]) -> str:
    """sha256 of the tokenised texts, one per line: two runs with equal digests were evaluated on
    the same texts in the same order, so their per-text results can be paired."""
    h = hashlib.sha256()
    for text in texts:
        h.update(" ".join(text).encode())
        h.update(b"\n")
    return h.hexdigest()


LABEL_FORMATS = ("tab", "first_token")


def label_format(label_column) -> str | None:
    """data.label_column as a format: None (no labels), 'tab' (`label<TAB>text`; `true`, the
    older spelling) or 'first_token' (`label text`, the label being the first token)."""
    if label_column is True:
        return "tab"
    if label_column in (False, None, "none"):
        return None
    if label_column not in LABEL_FORMATS:
        raise ConfigError(f"data.label_column: expected false, tab (or true) or first_token, got {label_column!r}")
    return label_column


def read_corpus(
    path: str | Path,
    lines: str | list[int] | tuple[int, int] | None = None,
    label_column: bool | str = False,
    max_length: int | None = None,
) -> Corpus:
    """Reads one text per line. Empty lines are skipped and counted, never an error.

    `\\r\\n` endings are accepted; a missing final newline is fine. Tokens are split on any
    Unicode whitespace (str.split), the same rule the tokenizer's WhitespaceSplit applies.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: {'a directory, not a file' if path.is_dir() else 'no such file' + _download_hint(path)}")
    span = parse_line_range(lines)
    labels = label_format(label_column)
    pieces = _file_lines(path, span)
    first, last = span or (1, len(pieces))
    corpus = Corpus([], [], str(path), lines_read=(first, last))
    for number in range(first, last + 1):
        try:
            text = pieces[number - 1].decode("utf-8")
        except UnicodeDecodeError as err:
            raise CorpusError(f"{path}:{number}: not valid UTF-8 (byte {err.start})") from None
        _add_line(corpus, number, text, labels, max_length)
    if not corpus.texts:
        where = f" (lines {span[0]}-{span[1]})" if span else ""
        if corpus.n_too_long:
            raise CorpusError(
                f"{path}{where}: no line of at most data.max_length={max_length} tokens "
                f"({corpus.n_too_long} longer lines skipped, {corpus.n_empty} empty)"
            )
        raise CorpusError(f"{path}{where}: no non-empty lines")
    return corpus


def _download_hint(path: Path) -> str:
    """For a missing DIR/<corpus>/{train,valid,test}.txt of a corpus `seqvae download` fetches (the
    paper-size configs read data/yahoo/train.txt): the command that fetches it."""
    from seqvae.text.download import CORPORA

    if path.parent.name in CORPORA and path.name in ("train.txt", "valid.txt", "test.txt"):
        return f" (fetch it: seqvae download {path.parent.name} --dest {path.parent.parent})"
    return ""


def _file_lines(path: Path, span: tuple[int, int] | None) -> list[bytes]:
    """The file's lines as bytes, split on \\n only: str.splitlines() would also split on \\x0b,
    \\x1c, \\u2028 …, so line numbers in errors would not match what an editor shows (a trailing
    \\r is whitespace)."""
    # Windows editors write a byte-order mark; left in, it would glue U+FEFF to the first word.
    pieces = path.read_bytes().removeprefix(codecs.BOM_UTF8).split(b"\n")
    if pieces[-1] == b"":  # the empty piece after a final newline is not a line
        pieces.pop()
    if span is not None and len(pieces) < span[1]:
        raise CorpusError(f"{path}: line range {span[0]}-{span[1]} but the file has {len(pieces)} lines")
    return pieces


def _add_line(corpus: Corpus, number: int, text: str, labels: str | None, max_length: int | None) -> None:
    """One file line into the corpus: its label taken off (`labels`), or skipped and counted
    (empty, too long), and what the label-format warnings need counted."""
    label, has_tab, label_like, head = None, "\t" in text, False, None
    if has_tab:
        head, rest = text.split("\t", 1)
        label_like = rest.strip() != "" and 0 < len(head.strip()) <= LABEL_MAX_CHARS and len(head.split()) == 1
        if labels == "tab":
            label, text = head.strip() or None, rest  # `<TAB>text` has no label, as a line without a tab
    tokens = text.split()
    first_token = tokens[0] if tokens else None
    if labels == "first_token" and tokens:
        label, tokens = tokens[0], tokens[1:]  # a line holding only a label has no text: empty
    if not tokens:
        corpus.n_empty += 1
        return
    if first_token is not None and LABEL_LIKE.match(first_token):
        corpus.n_first_label_like += 1
        corpus.first_tokens[first_token] += 1
    if max_length is not None and len(tokens) > max_length:
        corpus.n_too_long += 1
        return
    corpus.n_tab += has_tab
    if label_like:
        corpus.n_label_like += 1
        if corpus.first_label is None:
            corpus.first_label, corpus.first_label_line = head.strip(), number
    elif has_tab and not head.strip():
        corpus.n_blank_label += 1
        corpus.first_blank_label_line = corpus.first_blank_label_line or number
    elif has_tab:
        corpus.n_odd_label += 1
        corpus.first_odd_label_line = corpus.first_odd_label_line or number
    else:
        corpus.first_untabbed_line = corpus.first_untabbed_line or number
    corpus.texts.append(tokens)
    corpus.labels.append(label)
    corpus.line_numbers.append(number)


class Vocabulary:
    """Word-level vocabulary backed by an HF `tokenizers` WordLevel model.

    Ids 0–3 are pad, `<s>`, `</s>` and the unknown token. The id map is built here rather than
    with WordLevelTrainer: when the unknown token is itself a corpus word (`_UNK` in Yahoo/Yelp)
    the trainer gives it a second id and leaves id 3 empty (tokenizers 0.23). The specials are
    not registered as "added tokens" either, which would split a word such as `a<s>b`.
    """

    def __init__(self, tokenizer: Tokenizer, unk_token: str, reading: dict | None = None):
        self.tokenizer = tokenizer
        self.unk_token = unk_token
        # How the training text was read into words (`data.label_column`), saved with the id map
        # (vocab.json, and so every checkpoint) so that scoring a checkpoint reads text as its
        # training did. None: a vocabulary saved before seqvae recorded it.
        self.reading = reading
        self._id_to_token = {i: t for t, i in tokenizer.get_vocab().items()}

    @classmethod
    def build(
        cls,
        texts: list[list[str]],
        unk_token: str = "<unk>",
        min_freq: int = 1,
        max_size: int | None = None,
        reading: dict | None = None,
    ) -> Vocabulary:
        counts = Counter(tok for text in texts for tok in text)
        for special in (PAD, BOS, EOS, unk_token):
            counts.pop(special, None)
        # Most frequent first, ties alphabetically: the id map is a pure function of the data.
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[:max_size]
        vocab = {PAD: PAD_ID, BOS: BOS_ID, EOS: EOS_ID, unk_token: UNK_ID}
        vocab.update({w: i for i, w in enumerate(words, start=len(vocab))})
        tokenizer = Tokenizer(WordLevel(vocab, unk_token=unk_token))
        tokenizer.pre_tokenizer = WhitespaceSplit()
        return cls(tokenizer, unk_token, reading)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, texts: list[list[str]]) -> list[list[int]]:
        """Token lists -> ids with `<s>`/`</s>` around each."""
        if not texts:
            return []
        encodings = self.tokenizer.encode_batch(texts, is_pretokenized=True, add_special_tokens=False)
        # A corpus word spelled like a reserved token (`<s>`, `</s>`, `<pad>`) is not a boundary
        # or padding: it is an unknown word.
        return [[BOS_ID, *(UNK_ID if i < UNK_ID else i for i in e.ids), EOS_ID] for e in encodings]

    def decode(self, ids: list[int]) -> str:
        """Ids -> text, stopping at `</s>`, dropping `<s>`/pad; unknown words stay visible."""
        words = []
        for i in ids:
            if i == EOS_ID:
                break
            if i in (BOS_ID, PAD_ID):
                continue
            words.append(self._id_to_token[int(i)])
        return " ".join(words)

    def to_str(self) -> str:
        d = {"unk_token": self.unk_token, "tokenizer": json.loads(self.tokenizer.to_str())}
        if self.reading is not None:
            d["reading"] = self.reading
        return json.dumps(d)

    @classmethod
    def from_str(cls, s: str) -> Vocabulary:
        d = json.loads(s)
        return cls(Tokenizer.from_str(json.dumps(d["tokenizer"])), d["unk_token"], d.get("reading"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str())

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls.from_str(Path(path).read_text())


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


def collate(batch: list[torch.Tensor] | list[tuple[int, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pads `<s> … </s>` id sequences. tokens (B, T), lengths (B,) count `<s>` and `</s>`.
    Items of an `IndexedTexts` dataset, (position, ids), also give index (B,): each text's
    position in its split, which per-text results are keyed by."""
    index = None
    if batch and isinstance(batch[0], tuple):
        index = torch.tensor([i for i, _ in batch])
        batch = [x for _, x in batch]
    lengths = torch.tensor([len(x) for x in batch])
    tokens = torch.full((len(batch), int(lengths.max())), PAD_ID, dtype=torch.long)
    for i, x in enumerate(batch):
        tokens[i, : len(x)] = x
    out = {"tokens": tokens, "lengths": lengths}
    if index is not None:
        out["index"] = index
    return out


class IndexedTexts(torch.utils.data.Dataset):
    """A split's id sequences; item i is (i, ids), so that a batch knows which texts it holds."""

    def __init__(self, ids: list[torch.Tensor]):
        self.ids = ids

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i, self.ids[i]
