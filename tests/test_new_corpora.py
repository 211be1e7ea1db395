"""A new user's corpora (issue 33): a split is one value (its file and its lines), so an overlay,
a flag or a sweep variant that names another file cannot keep the first file's range; `label
text` corpora keep their labels out of the vocabulary; a checkpoint carries how its text was read;
and the small errors a new user met are one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_scoring import TINY, run

from seqvae.config_sources import data_sources, resolve, settle_splits
from seqvae.errors import ConfigError, CorpusError
from seqvae.text.datamodule import TextDataModule, label_column_hint, read_corpus
from seqvae.text.splits import parse_split

DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")


def numbered_corpus(path: Path, n: int, label: str | None = None, sep: str = " ") -> list[str]:
    """Lines `w{i} common words …` (line i's first word is unique: which lines were read shows)."""
    lines = [f"w{i} the cat sat {'on the mat' if i % 2 else 'by the door'} end" for i in range(1, n + 1)]
    text = [f"{i % 5 if label is None else label}{sep}{line}" for i, line in enumerate(lines, 1)] if sep else lines
    path.write_text("".join(t + "\n" for t in text))
    return lines


def first_words(corpus) -> list[str]:
    return [t[0] for t in corpus.texts]


# ---------------------------------------------------------------- a split is one value
def test_parse_split_keeps_the_file_and_its_lines_together(tmp_path):
    assert parse_split("a/b.txt#1-8000") == ("a/b.txt", (1, 8000))
    assert parse_split("a/b.txt") == ("a/b.txt", None)
    assert parse_split("x#3:7") == ("x", (3, 7))
    assert parse_split(None) is None
    with pytest.raises(CorpusError, match="expected FILE or FILE#FIRST-LAST"):
        parse_split("a.txt#first")
    odd = tmp_path / "a#b.txt"  # a '#' in an existing file's name is part of the name
    odd.write_text("x\n")
    assert parse_split(str(odd)) == (str(odd), None)


def test_datamodule_reads_each_split_with_its_own_range(tmp_path):
    path = tmp_path / "c.txt"
    numbered_corpus(path, 12, sep="")
    dm = TextDataModule(f"{path}#1-8", val=f"{path}#9-10", test=f"{path}#11-12", batch_size=2)
    assert [first_words(dm.corpora[s]) for s in ("train", "val", "test")] == [
        [f"w{i}" for i in range(1, 9)], ["w9", "w10"], ["w11", "w12"]
    ]
    assert dm.summary()["val"]["lines"] == "9-10"
    # the older form reads the same lines; a range given twice is refused, naming the option
    old = TextDataModule(str(path), train_lines="1-8", val_lines="9-10", test_lines="11-12", batch_size=2)
    assert {s: first_words(old.corpora[s]) for s in old.corpora} == {s: first_words(dm.corpora[s]) for s in dm.corpora}
    with pytest.raises(ConfigError, match="data.train_lines: data.train .* gives its lines already"):
        TextDataModule(f"{path}#1-8", train_lines="1-4")


def write_yaml(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_an_overlay_or_a_flag_naming_another_file_drops_the_base_configs_range(tmp_path):
    """The new user's case: a base config in the older form (train + train_lines, as yahoo10k's
    was) and an overlay `data: {train: mine.txt}`: the range was kept, silently."""
    base = write_yaml(tmp_path / "base.yaml", "data:\n  train: big.txt\n  train_lines: 1-8000\n  val_lines: 8001-9000\n")
    overlay = write_yaml(tmp_path / "mine.yaml", "data: {train: mine.txt}\n")
    for argv in (["--config", base, "--config", overlay], ["--config", base, "--data.train", "mine.txt"],
                 ["--config", base, "--data.train=mine.txt"]):  # fmt: skip
        state, old_form = resolve(data_sources(argv))
        assert old_form and (state["train"].path, state["train"].lines) == ("mine.txt", None), argv
        # val keeps the base's range of the base's file (never lines 8001-9000 of mine.txt) ...
        assert (state["val"].path, state["val"].lines) == ("big.txt", (8001, 9000)), argv
        data = {"train": "mine.txt", "train_lines": "1-8000", "val": None, "val_lines": "8001-9000", "test": None,
                "test_lines": None}  # fmt: skip  (what jsonargparse merges)
        lines = settle_splits(data, argv)
        assert data == {"train": "mine.txt", "train_lines": None, "val": "big.txt#8001-9000", "val_lines": None,
                        "test": None, "test_lines": None}, argv  # fmt: skip
        # ... and is said to be left beside the replaced training file
        assert any(line.startswith("seqvae: warning: data.val reads big.txt#8001-9000") for line in lines), lines
    # the range written beside the file, in the same source, stays with it (old and new form)
    state, _ = resolve(data_sources(["--config", base, "--data.train", "mine.txt", "--data.train_lines", "2-3"]))
    assert state["train"].value() == "mine.txt#2-3"
    state, _ = resolve(data_sources(["--config", base, "--data.train", "mine.txt#2-3"]))
    assert state["train"].value() == "mine.txt#2-3"


def test_fit_with_an_overlay_on_yahoo10k_style_config_trains_on_the_users_file_only(tmp_path, capsys):
    """End to end through `seqvae fit`: the base config holds ranges of its file in the older form,
    the user's overlay names their own training file (and, in a second run, val/test too)."""
    big, mine = tmp_path / "big.txt", tmp_path / "mine.txt"
    numbered_corpus(big, 40, sep="")
    numbered_corpus(mine, 25, sep="")
    base = write_yaml(tmp_path / "base.yaml", f"data:\n  train: {big}\n  train_lines: 1-30\n  val_lines: 31-35\n  test_lines: 36-40\n")
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    overlay = write_yaml(tmp_path / "mine.yaml", f"data: {{train: {mine}}}\n")
    status, err = run(["fit", "--config", base, "--config", overlay, *common, "--trainer.logger.init_args.version=a"], capsys)
    assert status == 0, err
    data = json.loads((tmp_path / "default" / "a" / "metrics.json").read_text())["data"]
    assert (data["train"]["file"], data["train"]["texts"], data["train"]["lines"]) == (str(mine), 25, "1-25")  # not 1-30
    assert (data["val"]["file"], data["val"]["lines"]) == (str(big), "31-35")
    assert f"seqvae: warning: data.val reads {big}#31-35" in err and f"data.train is now {mine} (--config {overlay})" in err
    assert "seqvae: note: data.*_lines is the older form" in err
    config = (tmp_path / "default" / "a" / "config.yaml").read_text()
    assert f"train: {mine}\n" in config and f"val: {big}#31-35" in config and "train_lines: null" in config
    full = write_yaml(tmp_path / "full.yaml", f"data: {{train: '{mine}#1-20', val: '{mine}#21-25', test: '{mine}#21-25'}}\n")
    status, err = run(["fit", "--config", base, "--config", full, *common, "--trainer.logger.init_args.version=b"], capsys)
    assert status == 0, err
    data = json.loads((tmp_path / "default" / "b" / "metrics.json").read_text())["data"]
    assert [data[s]["texts"] for s in ("train", "val", "test")] == [20, 5, 5] and "warning: data.val reads" not in err


# ---------------------------------------------------------------- label formats
def test_first_token_labels_are_kept_beside_the_text_never_in_the_vocabulary(tmp_path):
    path = tmp_path / "yelp.txt"
    lines = numbered_corpus(path, 30)
    corpus = read_corpus(path, label_column="first_token")
    assert corpus.labels == [str(i % 5) for i in range(1, 31)] and [" ".join(t) for t in corpus.texts] == lines
    dm = TextDataModule(f"{path}#1-20", val=f"{path}#21-25", test=f"{path}#26-30", label_column="first_token")
    vocab = dm.vocab.tokenizer.get_vocab()
    assert not {"0", "1", "2", "3", "4"} & set(vocab) and "w1" in vocab
    assert dm.vocab.reading["label_column"] == "first_token"
    # a label alone on its line leaves no text: counted as empty, like a blank line
    alone = tmp_path / "alone.txt"
    alone.write_text("3 good food\n4\n")
    assert read_corpus(alone, label_column="first_token").n_empty == 1


def test_label_like_first_tokens_are_warned_about_when_labels_are_off(tmp_path):
    path = tmp_path / "yelp.txt"
    numbered_corpus(path, 30)
    hint = label_column_hint(read_corpus(path), False)
    assert hint == (
        f"{path}: 100% of its 30 lines start with one of 5 label-like tokens ('0', '1', '2', '3', '4'), read as the "
        "texts' first words; if they are labels (`label text`), set --data.label_column first_token"
    )
    fasttext = tmp_path / "ft.txt"
    numbered_corpus(fasttext, 20, label="__label__pos")
    assert "'__label__pos'" in label_column_hint(read_corpus(fasttext), False)
    plain = tmp_path / "plain.txt"
    numbered_corpus(plain, 30, sep="")  # first tokens w1 … w30: words
    assert label_column_hint(read_corpus(plain), False) is None
    # tab labels asked for, space labels found: the line says which option fits
    assert "set --data.label_column first_token" in label_column_hint(read_corpus(path, label_column="tab"), "tab")
    # first_token asked for on a file without labels: its first words are not a handful of classes
    many = tmp_path / "many.txt"
    many.write_text("".join(f"word{i} and more text\n" for i in range(60)))
    hint = label_column_hint(read_corpus(many, label_column="first_token"), "first_token")
    assert "first tokens take 60 values" in hint and "--data.label_column false" in hint


def test_first_token_lines_without_their_label_are_warned_about(tmp_path):
    path = tmp_path / "ft.txt"
    lines = [f"__label__{'pos' if i % 2 else 'neg'} w{i} and more" for i in range(40)]
    lines[7], lines[30] = "The w7 lost its label", "God w30 too"  # file lines 8 and 31
    path.write_text("\n".join(lines) + "\n")
    hint = label_column_hint(read_corpus(path, label_column="first_token"), "first_token")
    assert hint == (
        f"{path}: data.label_column is first_token but 2 label(s) occur on one line only, where the others occur on "
        "up to 19: 'The' (line 8), 'God' (line 31); a line without its label has its first word read as one (and the "
        "word taken from its text)"
    )
    path.write_text("\n".join(f"{i % 3} w{i} text" for i in range(40)) + "\n")  # every label on many lines
    assert label_column_hint(read_corpus(path, label_column="first_token"), "first_token") is None
    path.write_text("\n".join(f"{i} w{i} text" for i in range(9)) + "\n")  # too few lines to tell: no warning
    assert label_column_hint(read_corpus(path, label_column="first_token"), "first_token") is None


def test_fit_on_a_space_labelled_corpus_then_test_reads_text_as_the_checkpoint_did(tmp_path, capsys):
    path = tmp_path / "yelp.txt"
    lines = numbered_corpus(path, 40)
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={path}#1-30", f"--data.val={path}#31-35", f"--data.test={path}#36-40",
                       "--data.label_column=first_token", *common, "--trainer.logger.init_args.version=fit"], capsys)  # fmt: skip
    assert status == 0, err
    run_dir = tmp_path / "default" / "fit"
    vocab = json.loads((run_dir / "vocab.json").read_text())
    assert vocab["reading"]["label_column"] == "first_token" and "3" not in vocab["tokenizer"]["model"]["vocab"]
    rows = (run_dir / "per_text.csv").read_text().splitlines()
    assert rows[0].endswith(",label") and rows[1].endswith(",1")  # line 36: label 36 % 5
    ckpt = run_dir / "checkpoints" / "best.ckpt"
    assert json.loads(torch.load(ckpt, weights_only=True)["vocab"])["reading"]["label_column"] == "first_token"
    # scoring: no --data.label_column given, the checkpoint's is used, and the data line is printed
    status, err = run(["test", f"--ckpt_path={ckpt}", f"--data.test={path}#36-40", *common[:1],
                       f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=t1"], capsys)  # fmt: skip
    assert status == 0, err
    tokens = sum(len(x.split()) + 1 for x in lines[35:40])
    assert f"seqvae: test: 5 texts ({path} lines 36-40, labels first_token), {tokens} predicted tokens" in err, err
    assert "label-like" not in err
    scored = json.loads((tmp_path / "default" / "t1" / "metrics.json").read_text())["data"]["test"]
    assert scored["predicted_tokens"] == tokens
    # overridden on the command line: read as words, and the warning says so
    status, err = run(["test", f"--ckpt_path={ckpt}", f"--data.test={path}#36-40", "--data.label_column=false", *common[:1],
                       f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=t2"], capsys)  # fmt: skip
    assert status == 0 and "label-like tokens" in err and f"{tokens + 5} predicted tokens" in err, err


def test_a_fit_whose_training_text_has_no_unknown_word_warns_when_validation_has_some(tmp_path, capsys):
    # A raw corpus read with min_freq 1 and no max_vocab: every training word is in the vocabulary,
    # so the unknown token never occurs in training; validation's new words are all scored as it.
    train, val = tmp_path / "train.txt", tmp_path / "valid.txt"
    numbered_corpus(train, 30, sep="")
    val.write_text("".join(f"the cat sat{i % 3} newword\n" for i in range(10)))
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={train}", f"--data.val={val}", f"--data.test={train}#1-5", *common], capsys)
    assert status == 0, err
    warnings = [line for line in err.splitlines() if "unknown to the vocabulary" in line]
    assert len(warnings) == 1 and warnings[0].startswith("seqvae: warning: data.val: "), err
    assert "data.val: 20 of its 40 tokens (50%) are unknown to the vocabulary, and the training text had none" in warnings[0]
    status, err = run(["fit", f"--data.train={train}", f"--data.val={val}", f"--data.test={train}#1-5", "--data.min_freq=2",
                       *common, "--trainer.logger.init_args.version=min_freq"], capsys)  # fmt: skip
    assert status == 0 and "training text had none" not in err, err


def test_a_text_far_longer_than_the_rest_is_named_with_its_line(tmp_path, capsys):
    # Before: an 8,631-token line that never broke passed with no notice among verses of ~30 tokens;
    # its batch's logits (batch × length × vocabulary) are what runs out of memory.
    from seqvae.text.hints import long_text_hint

    train = tmp_path / "train.txt"
    numbered_corpus(train, 40, sep="")  # 8 tokens a line
    with train.open("a") as f:
        f.write(" ".join(["word"] * 601) + "\n" + "w41 the end\n")
    corpus = read_corpus(str(train), None, False, None)
    assert long_text_hint(corpus) == (
        f"line 41 of {train} has 601 tokens, 75× the 90th percentile of its texts (8): its batch is padded to it (time, "
        "memory) and its NLL weighs on the per-text mean; --data.max_length 16 skips such lines"
    )
    two = tmp_path / "two.txt"  # two runaway lines in a small file do not hide each other (a 99th percentile would)
    runaway = {5: 700, 30: 650}
    two.write_text("".join((" ".join(["w"] * runaway[i]) if i in runaway else f"w{i} the cat sat") + "\n" for i in range(50)))
    # ... and each is named (the user who deletes the longest still has the other)
    assert long_text_hint(read_corpus(str(two), None, False, None)).startswith(
        f"line 6 of {two} has 700 tokens, 175× the 90th percentile of its texts (4) (and 1 more such line(s): 31): "
    )
    assert long_text_hint(read_corpus(str(train), None, False, 16)) is None  # skipped, as the line advises
    assert long_text_hint(read_corpus(str(train), (1, 40), False, None)) is None
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={train}", f"--data.val={train}#1-20", f"--data.test={train}#1-20", *common], capsys)
    assert status == 0, err
    assert [line for line in err.splitlines() if "90th percentile" in line] == [
        f"seqvae: warning: data.train: {long_text_hint(corpus)}"
    ], err
    ckpt = next(tmp_path.glob("**/checkpoints/best.ckpt"))  # predict reads its file whole: no max_length advice
    where = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=p"]
    status, err = run(["predict", f"--ckpt_path={ckpt}", f"--data.predict={train}", *where], capsys)
    assert status == 0 and "percentile" not in err, err


def test_text_without_spaces_and_a_mostly_unknown_training_text_are_warned_about(tmp_path, capsys):
    # A new user's corpus of Chinese lines: each line was one "word", the vocabulary one id per
    # training line, and nothing said why; with --data.min_freq 2 the training text was 100%
    # unknown, and still nothing was said. val and test given as the training file itself are what
    # the user asked for, not "not given".
    cjk = tmp_path / "cjk.txt"
    cjk.write_text("".join(f"今天天气很好我们去公园散步第{i}次\n" for i in range(30)), encoding="utf-8")
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={cjk}", f"--data.val={cjk}", f"--data.test={cjk}", *common], capsys)
    assert status == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("seqvae: warning: ")]
    assert warnings == [
        f"seqvae: warning: data.train: 30 of the 30 texts of {cjk} are one token: seqvae splits text on whitespace, so a "
        "text without spaces (Chinese, Japanese, …) is one word of the vocabulary; tokenise such a corpus first, one text "
        "per line with spaces between tokens (docs/data.md)"
    ], err
    mf2 = ["--data.min_freq=2", "--trainer.logger.init_args.version=mf2"]
    status, err = run(["fit", f"--data.train={cjk}", *mf2, *common], capsys)
    assert status == 0, err
    assert (
        "seqvae: warning: data.train: 100% of its tokens are unknown to the vocabulary: the model learns little but the "
        "unknown token"
    ) in err, err
    assert "seqvae: warning: data.val is not given" in err and "seqvae: warning: data.test is not given" in err


def test_a_share_is_printed_with_two_digits_never_in_e_notation():
    from seqvae.text.hints import percent

    assert [percent(r) for r in (0, 1, 0.9999, 0.995, 0.5, 0.123, 0.05, 0.0123, 1 / 36000)] == [
        "0%", "100%", ">99%", ">99%", "50%", "12%", "5.0%", "1.2%", "0.0028%",
    ]  # fmt: skip


def test_a_tab_with_nothing_before_it_is_a_text_without_a_label(tmp_path):
    path = tmp_path / "edge.tsv"
    path.write_text("".join(f"{i % 3}\tthe cat sat {i}\n" for i in range(10)) + "\tno label here\n")
    corpus = read_corpus(str(path), None, "tab", None)
    assert corpus.labels[-1] is None and corpus.texts[-1] == ["no", "label", "here"]
    assert label_column_hint(corpus, "tab") == (
        f"{path}: data.label_column is tab but 1 of 11 lines have nothing before the tab (first at line 11): they are "
        "read as text with no label"
    )


def test_a_split_set_to_the_training_file_keeps_its_name_in_compare():
    from seqvae.text.splits import fold_split_keys

    given = {"data.train": "a.txt", "data.val": "a.txt", "data.test": None}
    fold_split_keys(given)
    assert given == {"data.train": "a.txt", "data.val": "a.txt", "data.test": None}  # unset stays unset


def test_scoring_on_another_corpus_warns_about_its_unknown_rate(tmp_path, capsys):
    train, other = tmp_path / "train.txt", tmp_path / "other.txt"
    numbered_corpus(train, 30, sep="")
    other.write_text("".join(f"zz{i} yy{i} xx{i} the cat [UNK]\n" for i in range(10)))  # another unknown spelling
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={train}#1-25", f"--data.val={train}#21-25", f"--data.test={train}#21-25",
                       *common, "--trainer.logger.init_args.version=fit"], capsys)  # fmt: skip
    assert status == 0 and "unknown to the vocabulary" not in err, err
    ckpt = tmp_path / "default" / "fit" / "checkpoints" / "best.ckpt"
    status, err = run(["test", f"--ckpt_path={ckpt}", f"--data.test={other}", *common[:1],
                       f"--trainer.logger.init_args.save_dir={tmp_path}"], capsys)  # fmt: skip
    assert status == 0, err
    assert "seqvae: warning: data.test: 40 of its 60 tokens (67%) are unknown to the vocabulary, and the training text" in err
    assert (  # the checkpoint's vocabulary decides: no advice to set an option that scoring does not use
        "seqvae: warning: data.test: the checkpoint's unknown token '<unk>' never occurs in this text, but '[UNK]' occurs "
        "10 times: it is read as unknown, as a word outside it (the checkpoint's vocabulary decides; data.unk_token does "
        "not apply when scoring)"
    ) in err and "set --data.unk_token" not in err


# ---------------------------------------------------------------- one line each
def test_a_logger_directory_under_a_file_is_one_line_before_any_data_is_read(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("x\n")
    status, err = run(["fit", f"--data.train={tmp_path / 'missing.txt'}", f"--trainer.logger.init_args.save_dir={afile}"], capsys)
    assert status == 2 and err.strip().splitlines()[-1] == (
        f"seqvae: error: trainer.logger.init_args.save_dir: {afile} is a file, not a directory (save_dir {afile})"
    ), err


def test_an_unknown_key_in_a_config_file_names_the_file(tmp_path, capsys):
    bad = write_yaml(tmp_path / "bad.yaml", "data:\n  trian: x.txt\n")
    status, err = run(["fit", "--config", bad], capsys)
    assert status == 2 and f"'data.trian' (in --config {bad})" in err.strip().splitlines()[-1], err


def test_a_wrong_type_or_range_in_an_overlay_names_the_file_unless_the_command_line_set_it(tmp_path, capsys):
    wrong = write_yaml(tmp_path / "wrong.yaml", "model:\n  latent_dim: four\n")
    status, err = run(["fit", "--config", DEMO, "--config", wrong], capsys)
    last = err.strip().splitlines()[-1]
    assert status == 2 and last.startswith('seqvae: error: Parser key "model.latent_dim"'), err
    assert last.endswith(f"(in --config {wrong})")
    low = write_yaml(tmp_path / "low.yaml", "model:\n  lr: -1.0\n")
    status, err = run(["fit", "--config", DEMO, "--config", low], capsys)
    assert status == 2 and err.strip().splitlines()[-1] == f"seqvae: error: model.lr: must be > 0, got -1.0 (in --config {low})"
    status, err = run(["fit", "--config", DEMO, "--config", low, "--model.lr=-2"], capsys)  # the refused value is this one
    assert status == 2 and err.strip().splitlines()[-1] == "seqvae: error: model.lr: must be > 0, got -2.0"


def test_predict_in_mode_sample_reads_no_text(tmp_path, capsys):
    train = tmp_path / "train.txt"
    numbered_corpus(train, 30)  # label-like first tokens: any read of it would warn
    common = ["--model.test_iw_samples=2", "--trainer.max_epochs=1", f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]
    status, err = run(["fit", f"--data.train={train}#1-25", f"--data.val={train}#26-30", f"--data.test={train}#26-30",
                       "--data.label_column=first_token", *common, "--trainer.logger.init_args.version=fit"], capsys)  # fmt: skip
    assert status == 0, err
    ckpt = tmp_path / "default" / "fit" / "checkpoints" / "best.ckpt"
    status, err = run(["predict", f"--ckpt_path={ckpt}", f"--data.test={train}", "--data.label_column=false",
                       "--model.generation.mode=sample", "--model.generation.n=3",
                       f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=p"], capsys)  # fmt: skip
    assert status == 0, err
    assert "warning" not in err and "seqvae: test:" not in err, err
    assert len((tmp_path / "default" / "p" / "predictions.txt").read_text().splitlines()) == 3


def test_a_bad_checkpoint_is_seqvaes_own_line(tmp_path):
    from seqvae.store.checkpoints import load_checkpoint

    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CorpusError) as err:
        load_checkpoint(bad, "ckpt_path")
    assert str(err.value) == (
        f"ckpt_path: {bad}: not a readable checkpoint ({bad.stat().st_size} bytes: truncated, or not a file written by torch.save / seqvae fit)"
    )


@pytest.mark.parametrize(
    "content", [b"hello\n", b'{"a": 1}\n', bytes(range(256)) * 8, b""], ids=["text", "json", "bytes", "empty"]
)
def test_a_file_that_is_no_checkpoint_at_all_is_unreadable_not_unsafe(tmp_path, content):
    # Before: a text file gave a KeyError traceback from torch's unpickler; JSON and random bytes were
    # "refused to load (it carries objects other than weights…)", as if the file were a hostile pickle.
    from seqvae.store.checkpoints import load_checkpoint

    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(content)
    with pytest.raises(CorpusError) as err:
        load_checkpoint(bad, "ckpt_path")
    assert str(err.value).startswith(f"ckpt_path: {bad}: not a readable checkpoint ({len(content)} bytes:")


@pytest.mark.parametrize(
    "content, holds",
    [({"a": 1}, "a dict with keys 'a'"), ({"embed.weight": torch.zeros(2)}, "a dict with keys 'embed.weight'"),
     (torch.zeros(2), "a Tensor")],
    ids=["dict", "state_dict", "tensor"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["test", "fit", "init_encoder_from"])
def test_a_torch_file_that_is_no_run_checkpoint_is_one_line_before_any_run_directory(tmp_path, capsys, content, holds, command):
    # Before: KeyError 'pytorch-lightning_version' / 'state_dict' or AttributeError tracebacks (exit 1), after
    # `test` had written config.yaml, vocab.json and an event file into a new run directory.
    ckpt = tmp_path / "mine.ckpt"
    torch.save(content, ckpt)
    option = "model.init_encoder_from" if command == "init_encoder_from" else "ckpt_path"
    numbered_corpus(tmp_path / "train.txt", 30)  # init_encoder_from is read after the data
    argv = ["fit" if command == "init_encoder_from" else command, f"--{option}={ckpt}", f"--data.train={tmp_path / 'train.txt'}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]  # fmt: skip
    status, err = run(argv, capsys)
    assert status == 2 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"seqvae: error: {option}: {ckpt}: a torch.save file, but not a checkpoint of `seqvae fit` (it holds {holds}; "
        "a checkpoint is Lightning's dict with the model's 'state_dict', as RUN/checkpoints/best.ckpt)"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
@pytest.mark.parametrize("name", ["last", "best"])
def test_last_or_best_without_a_fit_in_the_command_is_refused(tmp_path, capsys, command, name):
    # Before: `test --ckpt_path last` tested the untrained model (exit 0, a record saying `last`); `best`: a traceback.
    status, err = run([command, f"--ckpt_path={name}", f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"], capsys)
    assert status == 2 and err.strip().splitlines()[-1] == (
        f"seqvae: error: ckpt_path: '{name}' names a checkpoint of this command's own fit, and `{command}` runs none: "
        f"give the file (RUN/checkpoints/{name}.ckpt)"
    ), err
    assert not (tmp_path / "runs").exists()


def test_compare_groups_a_run_in_the_older_form_with_the_same_run_in_the_new_one(tmp_path):
    from seqvae.analysis.runs import load_run

    old = "data:\n  train: c.txt\n  train_lines: 1-80\n  val: null\n  val_lines: 81-100\n  test: null\n  test_lines: 101-120\n  label_column: true\n"
    new = "data:\n  train: c.txt#1-80\n  train_lines: null\n  val: c.txt#81-100\n  test: c.txt#101-120\n  label_column: tab\n"
    other = new.replace("c.txt#1-80", "c.txt#1-70")
    configs = {}
    for name, text in (("old", old), ("new", new), ("other", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.yaml").write_text(text)
        (tmp_path / name / "metrics.json").write_text("{}")
        configs[name] = load_run(tmp_path / name)["config"]
    assert configs["old"] == configs["new"] != configs["other"]
    assert configs["old"]["data.val"] == "c.txt#81-100" and "data.val_lines" not in configs["old"]


def test_a_limit_written_as_an_integer_is_that_many_batches(tmp_path):
    from seqvae.config_sources import integer_limits

    cfg = write_yaml(tmp_path / "c.yaml", "trainer: {limit_val_batches: 1, limit_test_batches: 0.5}\n")
    assert integer_limits(["--config", cfg, "--trainer.limit_train_batches", "1"]) == {"limit_val_batches": 1, "limit_train_batches": 1}
    assert integer_limits(["--config", cfg, "--trainer.limit_val_batches=1.0"]) == {}  # a fraction: 100%


def test_a_missing_split_of_a_downloadable_corpus_names_the_download_command(tmp_path):
    # The paper-size configs read data/yahoo/train.txt; in a fresh clone it is not there yet.
    with pytest.raises(CorpusError) as err:
        read_corpus(str(tmp_path / "data" / "yahoo" / "train.txt"), None, False, None)
    assert str(err.value) == (
        f"{tmp_path / 'data' / 'yahoo' / 'train.txt'}: no such file (fetch it: seqvae download yahoo --dest {tmp_path / 'data'})"
    )
    with pytest.raises(CorpusError) as err:  # another file: no advice
        read_corpus(str(tmp_path / "mine" / "train.txt"), None, False, None)
    assert str(err.value) == f"{tmp_path / 'mine' / 'train.txt'}: no such file"
