"""Property-based tests of the corpus reader and the vocabulary on arbitrary bytes and text:
either a documented handling or a CorpusError naming the file (and line), never anything else."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seqvae.text.datamodule import UNK_ID, CorpusError, Vocabulary, read_corpus

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
lines = st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=40), max_size=12)
endings = st.sampled_from(["\n", "\r\n"])


@SETTINGS
@given(lines, endings, st.booleans(), st.booleans())
def test_reader_on_arbitrary_text(tmp_path_factory, texts, ending, final_newline, label_column):
    path = tmp_path_factory.mktemp("fuzz") / "c.txt"
    raw = ending.join(texts) + (ending if final_newline and texts else "")
    path.write_bytes(raw.encode("utf-8"))
    # What the documented rules give: lines split on \n only, a trailing \r is whitespace,
    # label before the first tab when label_column, tokens = str.split(), empty lines skipped.
    pieces = raw.split("\n")
    if pieces and pieces[-1] == "":
        pieces.pop()
    expected = []
    for piece in pieces:
        if label_column and "\t" in piece:
            piece = piece.split("\t", 1)[1]
        if piece.split():
            expected.append(piece.split())
    try:
        corpus = read_corpus(path, label_column=label_column)
    except CorpusError as err:
        assert expected == [] and str(err) == f"{path}: no non-empty lines"
        return
    assert corpus.texts == expected
    assert corpus.n_empty == len(pieces) - len(expected)
    vocab = Vocabulary.build(corpus.texts, unk_token="_UNK")
    ids = vocab.encode(corpus.texts)
    # every token round-trips through the WordLevel tokenizer as ONE id (no splitting)
    assert [len(x) - 2 for x in ids] == [len(t) for t in corpus.texts]
    reserved = {"<s>": "_UNK", "</s>": "_UNK", "<pad>": "_UNK"}
    assert [vocab.decode(x) for x in ids] == [" ".join(reserved.get(w, w) for w in t) for t in corpus.texts]
    assert sorted(vocab.tokenizer.get_vocab().values()) == list(range(len(vocab)))


@SETTINGS
@given(st.binary(max_size=200))
def test_reader_on_arbitrary_bytes_fails_only_with_a_located_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "b.txt"
    path.write_bytes(data)
    try:
        corpus = read_corpus(path)
    except CorpusError as err:
        message = str(err)
        assert "\n" not in message and message.startswith(str(path))
        assert re.fullmatch(rf"{re.escape(str(path))}(:\d+: not valid UTF-8 \(byte \d+\)|: no non-empty lines)", message)
        return
    assert all(t for t in corpus.texts)


@SETTINGS
@given(st.lists(st.lists(st.text(min_size=1, max_size=6).filter(lambda w: w.split() == [w]), min_size=1, max_size=6), min_size=1))
def test_unseen_and_unk_words_map_to_the_single_unk_id(texts):
    vocab = Vocabulary.build(texts + [["_UNK"]], unk_token="_UNK", max_size=3)
    kept = set(vocab.tokenizer.get_vocab())
    for text, ids in zip(texts, vocab.encode(texts)):
        for word, i in zip(text, ids[1:-1]):
            assert (i == UNK_ID) == (word not in kept or word in ("_UNK", "<s>", "</s>", "<pad>"))


def test_words_spelled_like_reserved_tokens_are_unknown_words():
    vocab = Vocabulary.build([["a", "<s>", "</s>", "<pad>", "b"]], unk_token="_UNK")
    assert vocab.encode([["a", "<s>", "</s>", "<pad>", "b"]]) == [[1, 4, 3, 3, 3, 5, 2]]
