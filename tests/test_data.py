"""Corpus reader, vocabulary, samplers and the data module (SPEC §1)."""

from __future__ import annotations

import random

import pytest
import torch

from seqvae.text.datamodule import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    BucketBatchSampler,
    CorpusError,
    RandomBatchSampler,
    TextDataModule,
    Vocabulary,
    collate,
    read_corpus,
)


def write(tmp_path, data: bytes, name="corpus.txt"):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------- reader
def test_label_column_is_metadata(tmp_path):
    path = write(tmp_path, b"4\tgreat food , slow service\n0\tnever again\nno label here\n")
    c = read_corpus(path, label_column=True)
    assert c.texts == [["great", "food", ",", "slow", "service"], ["never", "again"], ["no", "label", "here"]]
    assert c.labels == ["4", "0", None]
    # Without the option the tab is whitespace and the label is an ordinary token.
    plain = read_corpus(path)
    assert plain.texts[0] == ["4", "great", "food", ",", "slow", "service"]
    assert plain.labels == [None, None, None]


def test_label_column_keeps_text_tabs(tmp_path):
    c = read_corpus(write(tmp_path, b"1\ta\tb\n"), label_column=True)
    assert c.labels == ["1"] and c.texts == [["a", "b"]]


@pytest.mark.parametrize("final_newline", [b"", b"\n", b"\r\n"])
def test_crlf_and_missing_final_newline(tmp_path, final_newline):
    c = read_corpus(write(tmp_path, b"a b\r\nc\r\nd e f" + final_newline))
    assert c.texts == [["a", "b"], ["c"], ["d", "e", "f"]]
    assert c.n_empty == 0
    assert c.line_numbers == [1, 2, 3]
    assert all("\r" not in tok for text in c.texts for tok in text)


@pytest.mark.parametrize("ending", [b"", b"\n"])
def test_empty_and_whitespace_lines_skipped_and_counted(tmp_path, ending):
    # line 2 empty, 3 whitespace only, 5 a bare \r, 6 empty, 8 spaces and a tab
    data = b"a\n\n  \t \nb\r\n\r\n\nc\n \t" + (b"\nd" if ending == b"" else b"\nd\n")
    c = read_corpus(write(tmp_path, data))
    assert c.texts == [["a"], ["b"], ["c"], ["d"]]
    assert c.line_numbers == [1, 4, 7, 9]
    assert c.n_empty == 5


def test_trailing_blank_lines_counted(tmp_path):
    c = read_corpus(write(tmp_path, b"a\n\n\n"))
    assert c.texts == [["a"]] and c.n_empty == 2


@pytest.mark.parametrize("final_newline", [True, False])
def test_line_range_picks_exactly_those_lines(tmp_path, final_newline):
    data = b"one\ntwo\nthree\nfour\nfive" + (b"\n" if final_newline else b"")
    path = write(tmp_path, data)
    c = read_corpus(path, "2-4")
    assert c.texts == [["two"], ["three"], ["four"]]
    assert c.line_numbers == [2, 3, 4]
    assert c.n_empty == 0
    assert read_corpus(path, [5, 5]).texts == [["five"]]
    assert read_corpus(path, "1-5").texts == [["one"], ["two"], ["three"], ["four"], ["five"]]


def test_line_range_counts_empty_lines_inside_only(tmp_path):
    path = write(tmp_path, b"a\n\nb\n\nc\n\n")
    c = read_corpus(path, "2-4")  # "", "b", ""
    assert c.texts == [["b"]] and c.n_empty == 2
    c = read_corpus(path, "3-3")
    assert c.texts == [["b"]] and c.n_empty == 0


@pytest.mark.parametrize("final_newline", [True, False])
@pytest.mark.parametrize("spec", ["2-6", "6-6", "1-100"])
def test_line_range_past_eof_raises(tmp_path, final_newline, spec):
    path = write(tmp_path, b"one\ntwo\nthree\nfour\nfive" + (b"\n" if final_newline else b""))
    with pytest.raises(CorpusError, match="corpus.txt") as err:
        read_corpus(path, spec)
    assert "5 lines" in str(err.value)


@pytest.mark.parametrize("spec", ["3", "a-b", "4-2", "0-3"])
def test_bad_line_range_raises(tmp_path, spec):
    with pytest.raises(CorpusError):
        read_corpus(write(tmp_path, b"a\nb\nc\nd\n"), spec)


def test_non_utf8_line_names_file_and_line(tmp_path):
    path = write(tmp_path, b"fine\nstill fine\nbad \xff\xfe byte\nok\n")
    with pytest.raises(CorpusError) as err:
        read_corpus(path)
    assert f"{path}:3" in str(err.value)
    # A bad line outside the requested range is never decoded.
    assert read_corpus(path, "1-2").texts == [["fine"], ["still", "fine"]]
    assert read_corpus(path, "4-4").texts == [["ok"]]


@pytest.mark.parametrize("data", [b"", b"\n", b"  \n\t\n\r\n"])
def test_empty_file_raises_naming_file(tmp_path, data):
    path = write(tmp_path, data, "empty.txt")
    with pytest.raises(CorpusError, match="empty.txt"):
        read_corpus(path)


def test_missing_file_raises_naming_file(tmp_path):
    from seqvae.store.checkpoints import load_checkpoint
    from seqvae.text.corpus import load_vocabulary

    with pytest.raises(CorpusError, match="nowhere.txt: no such file$"):
        read_corpus(tmp_path / "nowhere.txt")
    folder = tmp_path / "a_directory"
    folder.mkdir()
    with pytest.raises(CorpusError, match="a_directory: a directory, not a file$"):  # it exists: not "no such file"
        read_corpus(folder)
    with pytest.raises(CorpusError, match="^data.vocab: .*a_directory is a directory, not a file$"):
        load_vocabulary(folder)
    with pytest.raises(CorpusError, match="^ckpt_path: .*a_directory is a directory, not a checkpoint file$"):
        load_checkpoint(folder, "ckpt_path")


def test_max_length_skips_and_counts(tmp_path):
    path = write(tmp_path, b"a b c\na b\n\na b c d\na\n")
    c = read_corpus(path, max_length=3)
    assert c.texts == [["a", "b", "c"], ["a", "b"], ["a"]]
    assert c.n_too_long == 1 and c.n_empty == 1
    assert c.line_numbers == [1, 2, 5]
    assert read_corpus(path, max_length=2).n_too_long == 2
    # every line too long is not "no non-empty lines": the error names the option that dropped them
    long_only = write(tmp_path, b"a b c\n\na b\n", name="long.txt")
    with pytest.raises(CorpusError, match=r"no line of at most data.max_length=1 tokens \(2 longer lines skipped, 1 empty\)"):
        read_corpus(long_only, max_length=1)


def test_byte_order_mark_is_not_part_of_the_first_word(tmp_path):
    path = write(tmp_path, b"\xef\xbb\xbfhello world\r\nhello again\n")
    assert read_corpus(path).texts == [["hello", "world"], ["hello", "again"]]
    # only at the start of the file: U+FEFF elsewhere is text (a zero-width no-break space)
    inner = write(tmp_path, b"a \xef\xbb\xbfb\n", name="inner.txt")
    assert read_corpus(inner).texts == [["a", "\ufeffb"]]


def test_very_long_line(tmp_path):
    words = [f"w{i % 97}" for i in range(10_000)]
    path = write(tmp_path, ("short line\n" + " ".join(words) + "\nend").encode())
    c = read_corpus(path)
    assert c.texts[1] == words
    vocab = Vocabulary.build(c.texts)
    ids = vocab.encode([words])[0]
    assert len(ids) == 10_002 and ids[0] == BOS_ID and ids[-1] == EOS_ID
    assert UNK_ID not in ids


def test_unicode_whitespace_splits(tmp_path):
    c = read_corpus(write(tmp_path, "a\u00a0b\u3000c  d\n".encode()))
    assert c.texts == [["a", "b", "c", "d"]]


# ---------------------------------------------------------------- vocabulary
UNK_CORPUS = [
    ["the", "_UNK", "cat", "sat"],
    ["the", "dog", "_UNK", "_UNK"],
    ["a", "cat", "the"],
]


def test_vocab_with_unk_in_corpus_is_a_bijection():
    vocab = Vocabulary.build(UNK_CORPUS, unk_token="_UNK")
    id_to_token = {i: vocab.tokenizer.id_to_token(i) for i in range(len(vocab))}
    # every id 0..len-1 maps to one token, and the tokens are distinct
    assert None not in id_to_token.values()
    assert len(set(id_to_token.values())) == len(vocab)
    assert vocab.tokenizer.get_vocab() == {t: i for i, t in id_to_token.items()}
    assert id_to_token[PAD_ID] == "<pad>" and id_to_token[BOS_ID] == "<s>" and id_to_token[EOS_ID] == "</s>"
    assert id_to_token[UNK_ID] == "_UNK"
    assert list(id_to_token.values()).count("_UNK") == 1
    # 4 reserved + the, cat, a, dog, sat
    assert len(vocab) == 9
    assert vocab.encode([["_UNK"], ["never-seen"], ["the", "_UNK", "zebra"]]) == [
        [BOS_ID, UNK_ID, EOS_ID],
        [BOS_ID, UNK_ID, EOS_ID],
        [BOS_ID, vocab.tokenizer.token_to_id("the"), UNK_ID, UNK_ID, EOS_ID],
    ]


def test_vocab_frequency_order_and_ties():
    texts = [["b", "a", "c", "c"], ["a", "d", "c"], ["e", "b"]]
    vocab = Vocabulary.build(texts)
    # c:3, then a:2, b:2 (alphabetical), then d:1, e:1
    words = [vocab.tokenizer.id_to_token(i) for i in range(4, len(vocab))]
    assert words == ["c", "a", "b", "d", "e"]
    # the map is a function of the multiset of tokens, not of the order of the corpus
    for seed in range(5):
        shuffled = [list(t) for t in texts]
        random.Random(seed).shuffle(shuffled)
        for t in shuffled:
            random.Random(seed + 1).shuffle(t)
        assert Vocabulary.build(shuffled).tokenizer.get_vocab() == vocab.tokenizer.get_vocab()


def test_vocab_min_freq_and_max_size():
    texts = [["x", "x", "x", "y", "y", "z"], ["x", "y", "w"]]  # x:4 y:3 z:1 w:1
    v = Vocabulary.build(texts, min_freq=2)
    assert len(v) == 6
    assert v.encode([["x", "y", "z", "w"]]) == [[BOS_ID, 4, 5, UNK_ID, UNK_ID, EOS_ID]]
    v = Vocabulary.build(texts, max_size=1)
    assert len(v) == 5
    assert v.encode([["x", "y"]]) == [[BOS_ID, 4, UNK_ID, EOS_ID]]
    v = Vocabulary.build(texts, min_freq=5)
    assert len(v) == 4
    assert v.encode([["x"]]) == [[BOS_ID, UNK_ID, EOS_ID]]


def test_specials_in_corpus_are_not_duplicated():
    v = Vocabulary.build([["<s>", "a", "</s>", "<pad>", "<unk>"]])
    assert len(v) == 5
    assert v.tokenizer.id_to_token(4) == "a"


def test_word_containing_special_stays_one_token():
    v = Vocabulary.build([["a<s>b", "x</s>", "c"]])
    ids = v.encode([["a<s>b", "x</s>", "c"]])[0]
    assert len(ids) == 5
    assert [v.tokenizer.id_to_token(i) for i in ids[1:-1]] == ["a<s>b", "x</s>", "c"]
    # unseen word that contains a special is one unk, not split around the special
    assert v.encode([["q<s>r"]]) == [[BOS_ID, UNK_ID, EOS_ID]]


def test_decode_stops_at_eos_and_keeps_unk():
    v = Vocabulary.build(UNK_CORPUS, unk_token="_UNK")
    ids = v.encode([["the", "zebra", "_UNK", "cat"]])[0]
    assert v.decode(ids) == "the _UNK _UNK cat"
    assert v.decode(ids + [v.tokenizer.token_to_id("dog")]) == "the _UNK _UNK cat"
    assert v.decode([BOS_ID, v.tokenizer.token_to_id("dog"), EOS_ID, v.tokenizer.token_to_id("cat")]) == "dog"
    assert v.decode([BOS_ID, 4, EOS_ID, PAD_ID, PAD_ID]) == v.tokenizer.id_to_token(4)
    assert v.decode(torch.tensor([BOS_ID, 4, 5]).tolist()) == " ".join(v.tokenizer.id_to_token(i) for i in (4, 5))


def test_vocab_round_trips(tmp_path):
    v = Vocabulary.build(UNK_CORPUS, unk_token="_UNK", max_size=3)
    probe = [["the", "_UNK", "cat", "sat", "dog", "zebra"], ["a"]]
    expected = v.encode(probe)
    for other in (Vocabulary.from_str(v.to_str()), _saved(v, tmp_path)):
        assert other.unk_token == "_UNK"
        assert len(other) == len(v)
        assert other.encode(probe) == expected
        assert other.decode(expected[0]) == v.decode(expected[0])
        assert other.tokenizer.get_vocab() == v.tokenizer.get_vocab()


def _saved(v, tmp_path):
    v.save(tmp_path / "vocab.json")
    return Vocabulary.load(tmp_path / "vocab.json")


def test_collate_pads_and_counts():
    out = collate([torch.tensor([1, 5, 2]), torch.tensor([1, 6, 7, 8, 2]), torch.tensor([1, 2])])
    assert out["tokens"].tolist() == [[1, 5, 2, 0, 0], [1, 6, 7, 8, 2], [1, 2, 0, 0, 0]]
    assert out["lengths"].tolist() == [3, 5, 2]


# ---------------------------------------------------------------- samplers
LENGTHS = [random.Random(0).randint(3, 9) for _ in range(203)]


def test_bucket_sampler_batches():
    s = BucketBatchSampler(LENGTHS, batch_size=8, shuffle=True, seed=3)
    batches = list(s)
    for b in batches:
        assert 1 <= len(b) <= 8
        assert len({LENGTHS[i] for i in b}) == 1
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(len(LENGTHS)))
    assert len(batches) == len(s)
    # cut into as few batches as possible per length
    expected = sum(-(-LENGTHS.count(n) // 8) for n in set(LENGTHS))
    assert len(s) == expected


def test_bucket_sampler_fixed_batches_new_order_each_epoch():
    s = BucketBatchSampler(LENGTHS, batch_size=8, shuffle=True, seed=3)
    epochs = [list(s) for _ in range(3)]  # the epoch advances on each pass
    as_sets = [sorted(map(tuple, e)) for e in epochs]
    assert as_sets[0] == as_sets[1] == as_sets[2]  # same batches
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]  # different order
    # reproducible for the same seed and epoch, whatever happened before
    other = BucketBatchSampler(LENGTHS, batch_size=8, shuffle=True, seed=3)
    random.seed(123)
    other.set_epoch(1)
    assert list(other) == epochs[1]
    other.set_epoch(1)
    assert list(other) == epochs[1]
    other.set_epoch(0)
    assert list(other) == epochs[0]
    # another seed gives another order of the same batches
    third = BucketBatchSampler(LENGTHS, batch_size=8, shuffle=True, seed=4)
    e = list(third)
    assert e != epochs[0] and sorted(map(tuple, e)) == as_sets[0]


def test_bucket_sampler_unshuffled_is_sorted_by_length():
    s = BucketBatchSampler(LENGTHS, batch_size=8, shuffle=False)
    first, second = list(s), list(s)
    assert first == second
    lens = [LENGTHS[b[0]] for b in first]
    assert lens == sorted(lens)


def test_random_sampler_covers_every_index_each_epoch():
    s = RandomBatchSampler(LENGTHS, batch_size=16, shuffle=True, seed=1)
    epochs = [list(s) for _ in range(3)]
    for e in epochs:
        assert sorted(i for b in e for i in b) == list(range(len(LENGTHS)))
        assert all(len(b) <= 16 for b in e) and len(e) == len(s) == 13
    assert epochs[0] != epochs[1]
    s.set_epoch(0)
    assert list(s) == epochs[0]
    plain = RandomBatchSampler(LENGTHS, batch_size=16, shuffle=False)
    assert [i for b in plain for i in b] == list(range(len(LENGTHS)))


# ---------------------------------------------------------------- data module
def test_datamodule_line_ranges_and_train_only_vocab(tmp_path):
    lines = [
        "alpha beta",  # 1 train
        "beta gamma beta",  # 2 train
        "",  # 3 train (empty)
        "gamma alpha",  # 4 train
        "delta beta",  # 5 val: delta only here
        "epsilon",  # 6 val
        "beta zeta",  # 7 test
        "alpha",  # 8 unused
    ]
    path = write(tmp_path, ("\n".join(lines) + "\n").encode())
    dm = TextDataModule(str(path), train_lines="1-4", val_lines="5-6", test_lines="7-7", batch_size=2, eval_batch_size=2)
    assert dm.corpora["train"].texts == [["alpha", "beta"], ["beta", "gamma", "beta"], ["gamma", "alpha"]]
    assert dm.corpora["val"].texts == [["delta", "beta"], ["epsilon"]]
    assert dm.corpora["test"].texts == [["beta", "zeta"]]
    assert dm.corpora["train"].line_numbers == [1, 2, 4]
    v = dm.vocab
    assert dm.vocab_size == len(v) == 4 + 3  # beta, alpha, gamma
    assert [v.tokenizer.id_to_token(i) for i in range(4, 7)] == ["beta", "alpha", "gamma"]
    beta = v.tokenizer.token_to_id("beta")
    assert v.tokenizer.token_to_id("delta") is None
    assert [t.tolist() for t in dm.ids["val"]] == [[BOS_ID, UNK_ID, beta, EOS_ID], [BOS_ID, UNK_ID, EOS_ID]]
    assert [t.tolist() for t in dm.ids["test"]] == [[BOS_ID, beta, UNK_ID, EOS_ID]]
    summary = dm.summary()
    assert summary["train"]["empty_lines_skipped"] == 1
    assert summary["train"]["texts"] == 3 and summary["train"]["tokens"] == 7 and summary["train"]["predicted_tokens"] == 10
    assert summary["train"]["unk_rate"] == 0.0
    assert summary["val"]["unk_rate"] == pytest.approx(2 / 3)
    # the loaders serve exactly those sentences
    seen = sorted(tuple(row[:n].tolist()) for b in dm.val_dataloader() for row, n in zip(b["tokens"], b["lengths"]))
    assert seen == sorted(tuple(t.tolist()) for t in dm.ids["val"])
    train = [b for b in dm.train_dataloader()]
    assert sum(b["tokens"].size(0) for b in train) == 3
    assert all((b["lengths"] == b["lengths"][0]).all() and b["tokens"].size(1) == b["lengths"][0] for b in train)


def test_datamodule_range_past_eof_raises(tmp_path):
    path = write(tmp_path, b"a\nb\nc\n", "short.txt")
    with pytest.raises(CorpusError, match="short.txt"):
        TextDataModule(str(path), train_lines="1-2", val_lines="3-4", test_lines="3-3")


def test_datamodule_padded_batching(tmp_path):
    path = write(tmp_path, b"a\na b\na b c\nb\nc c c c\n")
    dm = TextDataModule(str(path), batching="padded", batch_size=2, eval_batch_size=4)
    batches = list(dm.train_dataloader())
    assert [b["tokens"].size(0) for b in batches] == [2, 2, 1]
    for b in batches:
        t, n = b["tokens"], b["lengths"]
        assert t.size(1) == int(n.max())
        mask = torch.arange(t.size(1)) < n.unsqueeze(1)
        assert (t[~mask] == PAD_ID).all() and (t[mask] != PAD_ID).all()
        assert (t[torch.arange(t.size(0)), n - 1] == EOS_ID).all()
