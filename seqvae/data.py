"""Corpora, vocabulary and batching.

A corpus is one text per line, already tokenised (split on whitespace), optionally
`label<TAB>text` (Yelp). Every sequence becomes `<s> w1 … wn </s>`; the decoder reads
`<s> … wn` and predicts `w1 … </s>` (n + 1 predicted tokens).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from torch.utils.data import DataLoader, Sampler

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def run_seed() -> int:
    """The run's seed, `seed_everything` (Lightning exports it as PL_GLOBAL_SEED); 0 if none
    was set. Every seed left unset defaults to it, so that a run's seed varies everything."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class CorpusError(ValueError):
    """Bad input data; the message names the file (and line) and is printed as one line."""


class ConfigError(ValueError):
    """A combination of options this toolkit refuses; the message names the option."""


@dataclass
class Corpus:
    texts: list[list[str]]
    labels: list[str | None]
    path: str
    n_empty: int = 0  # empty / whitespace-only lines, skipped
    n_too_long: int = 0  # lines longer than max_length tokens, skipped
    line_numbers: list[int] = field(default_factory=list)  # 1-based, of each kept text


def texts_digest(texts: list[list[str]]) -> str:
    """sha256 of the tokenised texts, one per line: two runs with equal digests were evaluated on
    the same texts in the same order, so their per-text results can be paired."""
    h = hashlib.sha256()
    for text in texts:
        h.update(" ".join(text).encode())
        h.update(b"\n")
    return h.hexdigest()


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


def read_corpus(
    path: str | Path,
    lines: str | list[int] | tuple[int, int] | None = None,
    label_column: bool = False,
    max_length: int | None = None,
) -> Corpus:
    """Reads one text per line. Empty lines are skipped and counted, never an error.

    `\\r\\n` endings are accepted; a missing final newline is fine. Tokens are split on any
    Unicode whitespace (str.split), the same rule the tokenizer's WhitespaceSplit applies.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    span = parse_line_range(lines)
    raw = path.read_bytes()
    pieces = raw.split(b"\n")
    if pieces[-1] == b"":  # the empty piece after a final newline is not a line
        pieces.pop()
    if span is not None and len(pieces) < span[1]:
        raise CorpusError(f"{path}: line range {span[0]}-{span[1]} but the file has {len(pieces)} lines")
    first, last = span or (1, len(pieces))
    corpus = Corpus([], [], str(path))
    # Split on \n only: str.splitlines() would also split on \x0b, \x1c, \u2028 …, so line
    # numbers in errors would not match what an editor shows. A trailing \r is whitespace.
    for number in range(first, last + 1):
        line = pieces[number - 1]
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CorpusError(f"{path}:{number}: not valid UTF-8 (byte {err.start})") from None
        label = None
        if label_column and "\t" in text:
            label, text = text.split("\t", 1)
        tokens = text.split()
        if not tokens:
            corpus.n_empty += 1
            continue
        if max_length is not None and len(tokens) > max_length:
            corpus.n_too_long += 1
            continue
        corpus.texts.append(tokens)
        corpus.labels.append(label)
        corpus.line_numbers.append(number)
    if not corpus.texts:
        where = f" (lines {span[0]}-{span[1]})" if span else ""
        raise CorpusError(f"{path}{where}: no non-empty lines")
    return corpus


class Vocabulary:
    """Word-level vocabulary backed by an HF `tokenizers` WordLevel model.

    Ids 0–3 are pad, `<s>`, `</s>` and the unknown token. The id map is built here rather than
    with WordLevelTrainer: when the unknown token is itself a corpus word (`_UNK` in Yahoo/Yelp)
    the trainer gives it a second id and leaves id 3 empty (tokenizers 0.23). The specials are
    not registered as "added tokens" either, which would split a word such as `a<s>b`.
    """

    def __init__(self, tokenizer: Tokenizer, unk_token: str):
        self.tokenizer = tokenizer
        self.unk_token = unk_token
        self._id_to_token = {i: t for t, i in tokenizer.get_vocab().items()}

    @classmethod
    def build(
        cls,
        texts: list[list[str]],
        unk_token: str = "<unk>",
        min_freq: int = 1,
        max_size: int | None = None,
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
        return cls(tokenizer, unk_token)

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
        return json.dumps({"unk_token": self.unk_token, "tokenizer": json.loads(self.tokenizer.to_str())})

    @classmethod
    def from_str(cls, s: str) -> Vocabulary:
        d = json.loads(s)
        return cls(Tokenizer.from_str(json.dumps(d["tokenizer"])), d["unk_token"])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str())

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        return cls.from_str(Path(path).read_text())


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


UNK_SPELLINGS = ("<unk>", "_UNK", "UNK", "<UNK>", "[UNK]", "@@UNKNOWN@@", "<oov>", "OOV")


def unk_token_hint(texts: list[list[str]], unk_token: str) -> str | None:
    """A one-line warning when the configured unknown token never occurs in the training text
    but another common spelling of it does (a corpus prepared with `<unk>` read with `_UNK`
    would make `<unk>` an ordinary word and report an unknown rate of 0); else None."""
    counts = Counter(tok for text in texts for tok in text if tok in UNK_SPELLINGS or tok == unk_token)
    if counts[unk_token]:
        return None
    found = [(c, w) for w, c in counts.items() if w != unk_token]
    if not found:
        return None
    n, word = max(found)
    return (
        f"data.unk_token is {unk_token!r}, which never occurs in the training text, but {word!r} occurs {n} times: "
        f"if {word!r} is this corpus's unknown token, set --data.unk_token '{word}'"
    )


def load_vocabulary(path: str | Path) -> Vocabulary:
    """The vocabulary of a run: its `vocab.json`, or the one saved inside a checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"data.vocab: no such file {path}")
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

    try:
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except FileNotFoundError:
        raise CorpusError(f"{option}: no such checkpoint file {path}") from None
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CorpusError(
            f"{option}: {path}: refused to load (it carries objects other than weights and seqvae's settings; "
            f"only load checkpoints you trust with torch.load(weights_only=False) yourself): {first}"
        ) from None
    except (RuntimeError, EOFError) as err:
        raise CorpusError(f"{option}: {path}: not a readable checkpoint ({' '.join(str(err).split())[:200]})") from None


class _EpochHook:
    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def set_epoch(self, epoch: int) -> None:
        self.batch_sampler.set_epoch(epoch)


class BucketBatchSampler(Sampler[list[int]]):
    """The reference batching: sort by length, cut runs of EQUAL length into batches of at most
    `batch_size`, keep those batches fixed, visit them in a fresh random order each epoch.
    No batch holds padding. With `shuffle=False` the order is by length (evaluation).

    Under DDP (`num_replicas` > 1) each rank gets its own part of every epoch: in training the
    batches at positions rank, rank + R, … of the epoch's order, cut to the same number on every
    rank (the last len % R batches of the order are left out that epoch); in evaluation a
    contiguous run of the by-length batches, so that every text is evaluated exactly once and
    the ranks' rows, gathered in rank order, are the single-process rows in the same order.
    `resume(epoch, n)` makes that epoch's iteration skip its first n batches (a mid-epoch
    resume: the order itself depends only on seed and epoch)."""

    def __init__(self, lengths: list[int], batch_size: int, shuffle: bool, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0
        # Lightning calls `batch_sampler.sampler.set_epoch(e)` at every epoch start, with the
        # restored epoch when a run resumes: that keeps a resumed run's batch order exact.
        self.sampler = _EpochHook(self)
        by_length: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            by_length.setdefault(n, []).append(i)
        self.batches = [
            idx[s : s + batch_size] for n in sorted(by_length) for idx in [by_length[n]] for s in range(0, len(idx), batch_size)
        ]
        self._init_shard(num_replicas, rank)

    def _init_shard(self, num_replicas: int, rank: int) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} of {num_replicas} replicas")
        self.num_replicas, self.rank = num_replicas, rank
        self._skip: tuple[int, int] | None = None
        n = len(self.batches)
        # Evaluation: this rank's contiguous slice [start, stop) of the batches.
        self._start, self._stop = rank * n // num_replicas, (rank + 1) * n // num_replicas

    @property
    def preceding_sizes(self) -> list[int]:
        """Evaluation under DDP: the sizes of the batches that the ranks before this one
        evaluate, in order (a rank replays their evaluation noise to start where one process
        would be)."""
        return [len(b) for b in self.batches[: self._start]] if not self.shuffle else []

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume(self, epoch: int, batches_done: int) -> None:
        """The iteration of `epoch` starts after its first `batches_done` batches (of this rank)."""
        self._skip = (int(epoch), int(batches_done))

    def _epoch_batches(self) -> list[list[int]]:
        """All batches of the current epoch in their order (before sharding)."""
        order = list(range(len(self.batches)))
        if self.shuffle:
            # Seeded by (seed, epoch), not by the global RNG: the epoch's order is reproducible
            # and does not depend on what else drew random numbers.
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return [self.batches[i] for i in order]

    def _shard(self, batches: list[list[int]]) -> list[list[int]]:
        if self.num_replicas == 1:
            return batches
        if self.shuffle:
            return batches[self.rank :: self.num_replicas][: len(batches) // self.num_replicas]
        return batches[self._start : self._stop]

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the order is drawn at the first batch, not when the iterator is made.
        # Lightning makes the first epoch's iterator before it calls set_epoch.
        epoch = self.epoch
        batches = self._shard(self._epoch_batches())
        if self.shuffle:
            self.epoch += 1
        if self._skip is not None and self._skip[0] == epoch:
            batches = batches[self._skip[1] :]
        self._skip = None
        yield from batches

    def __len__(self) -> int:
        n = len(self.batches)
        if self.num_replicas == 1:
            return n
        return n // self.num_replicas if self.shuffle else self._stop - self._start


class RandomBatchSampler(BucketBatchSampler):
    """Padded batches of random sentences (mixed lengths), reshuffled every epoch (sharded
    across DDP ranks as BucketBatchSampler is)."""

    def __init__(self, lengths: list[int], batch_size: int, shuffle: bool, seed: int = 0, num_replicas: int = 1, rank: int = 0):
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0
        self.sampler = _EpochHook(self)
        self.n = len(lengths)
        self.batches = [list(range(s, min(s + batch_size, self.n))) for s in range(0, self.n, batch_size)]
        self._init_shard(num_replicas, rank)

    def _epoch_batches(self) -> list[list[int]]:
        if not self.shuffle:
            return self.batches
        perm = list(range(self.n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(perm)
        return [perm[s : s + self.batch_size] for s in range(0, self.n, self.batch_size)]


class _TrainLoader(DataLoader):
    """The training DataLoader, stateful for Lightning: a checkpoint records how many batches of
    which epoch the trainer has completed, and a mid-epoch restart makes the sampler skip them."""

    position = None  # set by TextDataModule: () -> {"epoch": e, "batches": n}

    def state_dict(self) -> dict:
        return self.position() if self.position is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.batch_sampler.resume(state["epoch"], state["batches"])


SAMPLERS = {"bucket": BucketBatchSampler, "padded": RandomBatchSampler}


class TextDataModule(pl.LightningDataModule):
    """Train/validation/test splits of a one-text-per-line corpus.

    The vocabulary is built from the training split in `__init__`, so that LightningCLI can link
    `data.vocab_size` to the model when both are instantiated.

    Args:
        train: Training file (not needed when `vocab` is given and nothing is trained).
        val: Validation file (default: the training file, with `val_lines`).
        test: Test file (default: the training file, with `test_lines`).
        train_lines: 1-based inclusive line range of `train` to use, e.g. "1-8000"; all if unset.
        val_lines: Line range of the validation file.
        test_lines: Line range of the test file.
        predict: Texts for `seqvae predict` (default: the test split), kept in file order.
        vocab: Take the vocabulary from this run's `vocab.json` or checkpoint instead of building
            it from `train` (which is then read only if the model trains). `seqvae
            validate/test/predict --ckpt_path C` set it to C, so scoring a checkpoint on a new
            file needs only that file.
        unk_token: The corpus's unknown-word token (`_UNK` for Yahoo/Yelp, `<unk>` for PTB).
        label_column: Lines are `label<TAB>text`; the label is kept as metadata, not modelled.
        min_freq: Training words seen fewer times map to the unknown token.
        max_vocab: Keep at most this many words (most frequent), besides the 4 reserved ids.
        max_length: Skip (and count) texts longer than this many tokens, in every split.
        batch_size: Sentences per batch.
        batching: "bucket": equal-length batches, no padding (the reference); "padded": random
            sentences padded to the batch's longest, with masks.
        eval_batch_size: Batch size for validation/test (MI per batch uses these batches).
        num_workers: DataLoader workers.
        seed: Seed of the batch order (epoch e uses seed and e); default: the run's
            `seed_everything`, so that runs with different seeds see different batch orders.
    """

    def __init__(
        self,
        train: str | None = None,
        val: str | None = None,
        test: str | None = None,
        train_lines: str | None = None,
        val_lines: str | None = None,
        test_lines: str | None = None,
        predict: str | None = None,
        vocab: str | None = None,
        unk_token: str = "<unk>",
        label_column: bool = False,
        min_freq: int = 1,
        max_vocab: int | None = None,
        max_length: int | None = None,
        batch_size: int = 32,
        batching: Literal["bucket", "padded"] = "bucket",
        eval_batch_size: int = 32,
        num_workers: int = 0,
        seed: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        if seed is None:
            self.hparams.seed = run_seed()
        self.corpora: dict[str, Corpus] = {}  # the splits read so far
        self.ids: dict[str, list[torch.Tensor]] = {}
        if vocab is not None:
            # Splits are read when first needed (`split_ids`): scoring a checkpoint needs
            # neither the training text nor the other splits.
            self.vocab = load_vocabulary(vocab)
            return
        self.read_splits(("train", "val", "test"))
        self.vocab = Vocabulary.build(self.corpora["train"].texts, unk_token, min_freq, max_vocab)
        hint = unk_token_hint(self.corpora["train"].texts, unk_token)
        if hint is not None:
            print(f"seqvae: warning: {hint}", file=sys.stderr)
        for split in ("train", "val", "test"):
            self.split_ids(split)

    def read_splits(self, splits) -> None:
        """Reads these splits' files now (errors name the option, file and line)."""
        h = self.hparams
        sources = {"train": (h.train, h.train_lines), "val": (h.val or h.train, h.val_lines), "test": (h.test or h.train, h.test_lines)}
        for split in splits:
            if split in self.corpora:
                continue
            path, lines = sources[split]
            option = split if split == "train" or (h.val, h.test)[split == "test"] else f"{split} (= train)"
            if path is None:
                raise CorpusError(f"data.{split}: no file given (and no data.train to fall back on)")
            try:
                self.corpora[split] = read_corpus(path, lines, h.label_column, h.max_length)
            except CorpusError as err:  # name the option as well as the file
                raise CorpusError(f"data.{option}: {err}") from None

    def split_ids(self, split: str) -> list[torch.Tensor]:
        """The split's texts as id sequences, reading its file if not done yet."""
        if split not in self.ids:
            self.read_splits([split])
            self.ids[split] = [torch.tensor(x) for x in self.vocab.encode(self.corpora[split].texts)]
        return self.ids[split]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def summary(self) -> dict[str, dict[str, float]]:
        """Sizes, skipped lines, unknown-token rate and the digest of the texts (equal digests:
        the same texts in the same order) of each split read (all three at fit start)."""
        out = {}
        for split, corpus in self.corpora.items():
            ids = torch.cat(self.split_ids(split))
            words = ids[(ids != BOS_ID) & (ids != EOS_ID)]
            out[split] = {
                "texts": len(corpus.texts),
                "tokens": int(words.numel()),
                "predicted_tokens": int(words.numel()) + len(corpus.texts),
                "unk_rate": float((words == UNK_ID).float().mean()),
                "empty_lines_skipped": corpus.n_empty,
                "too_long_skipped": corpus.n_too_long,
                "file": corpus.path,
                "sha256": texts_digest(corpus.texts),
            }
        return out

    def _replicas(self) -> tuple[int, int]:
        """(world size, rank) of the trainer this datamodule is attached to; (1, 0) without one."""
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return 1, 0
        if trainer._accelerator_connector.use_distributed_sampler:
            raise ConfigError(
                "trainer.use_distributed_sampler: must be false under DDP (TextDataModule shards its batches across ranks itself)"
            )
        return trainer.world_size, trainer.global_rank

    def _train_position(self) -> dict[str, int]:
        """Where the fit is in the current epoch, for a mid-epoch checkpoint."""
        trainer = self.trainer
        if trainer is None:
            return {}
        return {"epoch": trainer.current_epoch, "batches": trainer.fit_loop.epoch_loop.batch_progress.current.processed}

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        data = self.split_ids(split)
        batch_size = self.hparams.batch_size if split == "train" else self.hparams.eval_batch_size
        replicas, rank = self._replicas()
        sampler = SAMPLERS[self.hparams.batching]([len(x) for x in data], batch_size, shuffle, self.hparams.seed, replicas, rank)
        # Own generator: making an iterator draws a worker base seed, and from the global RNG
        # that draw would shift the training noise depending on when Lightning makes it.
        kind = _TrainLoader if split == "train" else DataLoader
        loader = kind(
            IndexedTexts(data) if split != "train" else data,
            batch_sampler=sampler, collate_fn=collate, num_workers=self.hparams.num_workers, generator=torch.Generator()
        )
        if split == "train":
            loader.position = self._train_position
        return loader

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        if self.hparams.predict:
            corpus = read_corpus(self.hparams.predict, None, self.hparams.label_column)
            data = [torch.tensor(x) for x in self.vocab.encode(corpus.texts)]
        elif self.hparams.test or self.hparams.train:
            data = self.split_ids("test")
        else:
            raise CorpusError("data.predict: no input texts (give --data.predict FILE; mode sample ignores them, any one-line file will do)")
        # File order (padded batches, not length buckets): output line i is input line i.
        sampler = RandomBatchSampler([len(x) for x in data], self.hparams.eval_batch_size, shuffle=False)
        return DataLoader(data, batch_sampler=sampler, collate_fn=collate)

    def random_train_batch(self, generator: random.Random) -> dict[str, torch.Tensor]:
        """One uniformly drawn training batch (aggressive training's inner loop)."""
        data = self.split_ids("train")
        if not hasattr(self, "_train_batches"):
            self._train_batches = SAMPLERS[self.hparams.batching]([len(x) for x in data], self.hparams.batch_size, False).batches
        return collate([data[i] for i in generator.choice(self._train_batches)])
