"""`TextDataModule`, which owns a run's splits and vocabulary and makes their batches (the
samplers are in `samplers.py`; reading files and the vocabulary itself in `corpus.py`).
"""

from __future__ import annotations

import random
import sys
from typing import Literal

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from seqvae.errors import ConfigError, CorpusError  # noqa: F401
from seqvae.options import DATA_OPTIONS, check_option

# The names a user of the data layer needs, re-exported (`from seqvae.data import BOS_ID`).
from seqvae.store.checkpoints import load_checkpoint  # noqa: F401
from seqvae.text.corpus import (  # noqa: F401
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    PAD,
    PAD_ID,
    UNK_ID,
    Corpus,
    IndexedTexts,
    Vocabulary,
    collate,
    label_format,
    load_vocabulary,
    read_corpus,
    run_seed,
    texts_digest,
)
from seqvae.text.hints import label_column_hint, unk_token_hint  # noqa: F401
from seqvae.text.samplers import SAMPLERS, BucketBatchSampler, RandomBatchSampler, TrainLoader  # noqa: F401
from seqvae.text.splits import parse_line_range, parse_split, resolve_splits, split_value  # noqa: F401


class TextDataModule(pl.LightningDataModule):
    """Train/validation/test splits of a one-text-per-line corpus.

    The vocabulary is built from the training split in `__init__`, so that LightningCLI can link
    `data.vocab_size` to the model when both are instantiated.

    A split is one value, its file and its lines together: `FILE` (every line) or
    `FILE#FIRST-LAST` (1-based, inclusive lines), e.g. `../shared/data/yahoo/valid.txt#1-8000`,
    so that giving another file (a flag, an overlay config, a sweep variant) cannot keep the
    first file's range.

    Args:
        train: Training split, `FILE` or `FILE#FIRST-LAST` (not needed when `vocab` is given and
            nothing is trained).
        val: Validation split (default: the training split itself, with a warning).
        test: Test split (default: the training split itself, with a warning).
        train_lines: The older form of a range (configs written before it keep loading):
            `train: F` with `train_lines: 1-8000` reads as `train: F#1-8000`. So do `val_lines`
            and `test_lines`: with `val`/`test` unset, ranges of the training file.
        predict: Texts for `seqvae predict` (default: the test split), kept in file order.
        vocab: Take the vocabulary from this run's `vocab.json` or checkpoint instead of building
            it from `train` (which is then read only if the model trains). `seqvae
            validate/test/predict --ckpt_path C` set it to C, so scoring a checkpoint on a new
            file needs only that file.
        unk_token: The corpus's unknown-word token (`_UNK` for Yahoo/Yelp, `<unk>` for PTB).
        label_column: Lines start with a label, kept beside the text (per_text.csv), never in
            the vocabulary: `tab` (`label<TAB>text`; `true` is the older spelling) or
            `first_token` (`label text`: the first whitespace-separated token); `false`: no
            labels. Unset: the `vocab` checkpoint's setting (how its training read text), else false.
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
        label_column: bool | Literal["tab", "first_token"] | None = None,
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
        for option, allowed in DATA_OPTIONS.items():  # before any file is read (seqvae/options.py)
            check_option(f"data.{option}", self.hparams[option], allowed)
        if seed is None:
            self.hparams.seed = run_seed()
        self.splits = resolve_splits(train, val, test, train_lines, val_lines, test_lines)
        self.corpora: dict[str, Corpus] = {}  # the splits read so far
        self._label_warned: set[str] = set()  # files warned about (train, val and test may share one)
        self.ids: dict[str, list[torch.Tensor]] = {}
        if vocab is not None:
            # Splits are read when first needed (`split_ids`): scoring needs no training text.
            self.vocab = load_vocabulary(vocab)
            if label_column is None and self.vocab.reading is not None:
                self.hparams.label_column = self.vocab.reading.get("label_column", False)
            return
        self.hparams.label_column = label_column or False
        self.read_splits(("train", "val", "test"))
        reading = {"label_column": label_format(self.hparams.label_column) or False}
        self.vocab = Vocabulary.build(self.corpora["train"].texts, unk_token, min_freq, max_vocab, reading)
        self.unk_hint("train")
        for split in ("train", "val", "test"):
            self.split_ids(split)
        self.vocab.reading["train_unk_rate"] = self.unk_rate("train")  # for `unk_rate_hint` when scoring

    def unk_rate(self, split: str) -> float:
        ids = torch.cat(self.split_ids(split))
        words = ids[(ids != BOS_ID) & (ids != EOS_ID)]
        return float((words == UNK_ID).float().mean())

    def unk_hint(self, split: str) -> None:
        """The unknown-token warning for a split read with this vocabulary's unknown token."""
        known = self.vocab.tokenizer.token_to_id if "train" not in self.corpora else None  # scoring a checkpoint
        hint = unk_token_hint(self.corpora[split].texts, self.vocab.unk_token, known)
        if hint is not None:
            print(f"seqvae: warning: data.{split}: {hint}", file=sys.stderr)

    def read_splits(self, splits) -> None:
        """Reads these splits' files now (errors name the option, file and line)."""
        h = self.hparams
        for split in splits:
            if split in self.corpora:
                continue
            option = split if split == "train" or (h.val, h.test)[split == "test"] else f"{split} (= train)"
            if self.splits[split] is None:
                raise CorpusError(f"data.{split}: no file given (and no data.train to fall back on)")
            path, lines = self.splits[split]
            same = next((s for s in self.corpora if self.splits.get(s) == self.splits[split]), None)
            if same is not None:  # val/test that are the training split: read and encoded once
                self.corpora[split] = self.corpora[same]
                if same in self.ids:
                    self.ids[split] = self.ids[same]
                continue
            try:
                self.corpora[split] = read_corpus(path, lines, h.label_column, h.max_length)
            except CorpusError as err:  # name the option as well as the file
                raise CorpusError(f"data.{option}: {err}") from None
            self._warn_label_column(self.corpora[split], f"data.{option}")

    def _warn_label_column(self, corpus: Corpus, option: str) -> None:
        hint = label_column_hint(corpus, self.hparams.label_column)
        if hint is not None and corpus.path not in self._label_warned:
            self._label_warned.add(corpus.path)
            print(f"seqvae: warning: {option}: {hint}", file=sys.stderr)

    def split_ids(self, split: str) -> list[torch.Tensor]:
        """The split's texts as id sequences, reading its file if not done yet."""
        if split == "predict":
            self.predict_corpus()
        elif split not in self.ids:
            self.read_splits([split])
            self.ids[split] = [torch.tensor(x) for x in self.vocab.encode(self.corpora[split].texts)]
        return self.ids[split]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def summary(self) -> dict[str, dict[str, float]]:
        """Each split read: sizes, skipped lines, unknown rate, the texts' digest (equal: same texts, same order)."""
        out = {}
        for split, corpus in self.corpora.items():
            ids = torch.cat(self.split_ids(split))
            words = ids[(ids != BOS_ID) & (ids != EOS_ID)]
            first, last = corpus.lines_read
            out[split] = {
                "lines": f"{first}-{last}",
                "label_column": label_format(self.hparams.label_column) or False,
                "texts": len(corpus.texts),
                "tokens": int(words.numel()),
                "predicted_tokens": int(words.numel()) + len(corpus.texts),
                "unk_rate": self.unk_rate(split),
                "empty_lines_skipped": corpus.n_empty,
                "too_long_skipped": corpus.n_too_long,
                "file": corpus.path,
                "sha256": texts_digest(corpus.texts),
            }
        return out

    def _replicas(self) -> tuple[int, int]:  # (world size, rank) of the trainer; (1, 0) without one
        trainer = self.trainer
        if trainer is None or trainer.world_size == 1:
            return 1, 0
        if trainer._accelerator_connector.use_distributed_sampler:
            raise ConfigError(
                "trainer.use_distributed_sampler: must be false under DDP (TextDataModule shards its batches across ranks itself)"
            )
        return trainer.world_size, trainer.global_rank

    def _train_position(self) -> dict[str, int]:  # where the fit is in its epoch, for a mid-epoch checkpoint
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
        kind = TrainLoader if split == "train" else DataLoader
        loader = kind(
            IndexedTexts(data) if split != "train" else data,
            batch_sampler=sampler,
            collate_fn=collate,
            num_workers=self.hparams.num_workers,
            generator=torch.Generator(),
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

    def predict_corpus(self) -> Corpus | None:
        """The `data.predict` file, read once (None without one); kept as the pseudo-split
        "predict", so that `summary()` describes it as it does the splits."""
        if self.hparams.predict and "predict" not in self.corpora:
            try:
                self.corpora["predict"] = read_corpus(*parse_split(self.hparams.predict), self.hparams.label_column)
            except CorpusError as err:
                raise CorpusError(f"data.predict: {err}") from None
            self._warn_label_column(self.corpora["predict"], "data.predict")
            self.ids["predict"] = [torch.tensor(x) for x in self.vocab.encode(self.corpora["predict"].texts)]
        return self.corpora.get("predict")

    def predict_source(self) -> Corpus | None:
        """The corpus `predict_dataloader` reads (data.predict, else the test split), for lining
        the outputs up with its file's lines; None where neither was read."""
        if self.hparams.predict:
            return self.predict_corpus()
        return self.corpora.get("test")

    prior_only = False  # `predict` in mode sample (set by the CLI): decodes from the prior, reads no text

    def predict_dataloader(self) -> DataLoader:
        if self.prior_only:  # one placeholder batch: the predict loop needs one step to run
            data = [torch.tensor([BOS_ID, EOS_ID])]
        elif self.hparams.predict:
            self.predict_corpus()
            data = self.ids["predict"]
        elif self.hparams.test or self.hparams.train:
            data = self.split_ids("test")
        else:
            raise CorpusError("data.predict: no input texts (give --data.predict FILE; mode sample ignores them)")
        # File order (padded batches, not length buckets): output line i is input line i. A plain
        # sequential DataLoader, which Lightning knows returns every text (no warning about it).
        return DataLoader(data, batch_size=self.hparams.eval_batch_size, shuffle=False, collate_fn=collate)

    def random_train_batch(self, generator: random.Random) -> dict[str, torch.Tensor]:
        """One uniformly drawn training batch (aggressive training's inner loop)."""
        data = self.split_ids("train")
        if not hasattr(self, "_train_batches"):
            self._train_batches = SAMPLERS[self.hparams.batching]([len(x) for x in data], self.hparams.batch_size, False).batches
        return collate([data[i] for i in generator.choice(self._train_batches)])
