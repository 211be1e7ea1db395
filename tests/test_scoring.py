"""Scoring a checkpoint on a new file, checkpoints as data, and the unknown-token hint.

`seqvae test --ckpt_path C --data.test FILE` needs only C and FILE: the vocabulary comes from
the checkpoint, a line range of the run's config does not carry over to the new file, and a
checkpoint that would run code when unpickled is refused in one line (nothing runs)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from test_model import write_corpus

from seqvae.commands import main
from seqvae.text.datamodule import TextDataModule, label_column_hint, read_corpus, unk_token_hint

TINY = ["--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4", "--trainer.enable_model_summary=false",
        "--model.pooling=max", "--model.val_iw_samples=0", "--trainer.num_sanity_val_steps=0"]  # fmt: skip


def run(args, capsys):
    """Runs `seqvae ARGS` in this process: (exit status, stderr)."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        status = 0
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run trained on lines 1-80 of one file (val 81-100, test 101-120, as yahoo10k does)."""
    root = tmp_path_factory.mktemp("scoring")
    write_corpus(root / "corpus.txt", 120, 0)
    args = ["fit", f"--data.train={root / 'corpus.txt'}", "--data.train_lines=1-80", "--data.val_lines=81-100",
            "--data.test_lines=101-120", "--model.test_iw_samples=2", "--trainer.max_epochs=1",
            f"--trainer.logger.init_args.save_dir={root / 'runs'}", *TINY]  # fmt: skip
    main(args)
    return root, root / "runs" / "default" / "version_0"


def metrics(run_dir: Path, name="metrics.json") -> dict:
    return json.loads((run_dir / name).read_text())


def test_score_a_checkpoint_on_a_new_file_without_the_training_text(trained, tmp_path, capsys, monkeypatch):
    root, run_dir = trained
    new = tmp_path / "new.txt"
    lines = write_corpus(new, 17, 5)
    ckpt = tmp_path / "model.ckpt"
    shutil.copy(run_dir / "checkpoints" / "best.ckpt", ckpt)  # the checkpoint alone, elsewhere
    monkeypatch.chdir(tmp_path)
    moved = root / "corpus.moved"
    os.rename(root / "corpus.txt", moved)  # the training corpus is gone
    try:
        status, err = run(["test", f"--ckpt_path={ckpt}", f"--data.test={new}", "--model.test_iw_samples=2"], capsys)
    finally:
        os.rename(moved, root / "corpus.txt")
    assert status == 0, err
    out = metrics(tmp_path / "runs" / "default" / "version_0")
    assert out["data"]["test"]["texts"] == len(lines) and set(out["data"]) == {"test"}
    assert out["data"]["test"]["predicted_tokens"] == sum(len(x.split()) + 1 for x in lines)


def test_the_configs_line_range_does_not_carry_over_to_a_new_file(trained, tmp_path, capsys):
    _, run_dir = trained
    new = tmp_path / "new.txt"
    lines = write_corpus(new, 30, 6)
    base = ["test", f"--config={run_dir / 'config.yaml'}", f"--ckpt_path={run_dir / 'checkpoints' / 'best.ckpt'}",
            f"--trainer.logger.init_args.save_dir={tmp_path}"]  # fmt: skip
    status, err = run([*base, f"--data.test={new}"], capsys)
    assert status == 0, err
    assert metrics(tmp_path / "default" / "version_0")["data"]["test"]["texts"] == len(lines)  # not lines 101-120
    status, err = run([*base, f"--data.test={new}", "--data.test_lines=3-7"], capsys)  # a range given with it is kept
    assert status == 0, err
    assert metrics(tmp_path / "default" / "version_1")["data"]["test"]["texts"] == 5
    status, err = run(base, capsys)  # no new file: the run's own test split
    assert status == 0, err
    assert metrics(tmp_path / "default" / "version_2")["data"]["test"]["texts"] == 20


def test_fit_on_new_files_drops_the_configs_line_ranges_unless_given(trained, tmp_path, capsys):
    """yahoo10k's configs carry line ranges of their file; training them on your own files must
    not apply those ranges to yours (a range given on the command line is kept)."""
    _, run_dir = trained
    new = tmp_path / "new.txt"
    write_corpus(new, 30, 7)
    args = ["fit", f"--config={run_dir / 'config.yaml'}", f"--data.train={new}", f"--data.val={new}", "--data.val_lines=1-5",
            f"--data.test={new}", f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.logger.init_args.version=x"]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    data = metrics(tmp_path / "default" / "x")["data"]
    assert (data["train"]["texts"], data["val"]["texts"], data["test"]["texts"]) == (30, 5, 30)


def test_a_new_training_file_alone_leaves_val_and_test_where_they_were_and_says_so(trained, tmp_path, capsys):
    """Only --data.train given: a split is its file and its lines, so val and test stay the config's
    (lines 81-100 and 101-120 of *its* file, never those lines of the new file, which would be
    trained on), and a warning names each split left beside the replaced training file."""
    root, run_dir = trained
    new = tmp_path / "new.txt"
    write_corpus(new, 130, 7)
    args = ["fit", f"--config={run_dir / 'config.yaml'}", f"--data.train={new}",
            f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.logger.init_args.version=y"]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    data = metrics(tmp_path / "default" / "y")["data"]
    assert (data["train"]["texts"], data["val"]["texts"], data["test"]["texts"]) == (130, 20, 20)
    assert (data["val"]["file"], data["val"]["lines"], data["test"]["lines"]) == (str(root / "corpus.txt"), "81-100", "101-120")
    for split, lines in (("val", "81-100"), ("test", "101-120")):
        assert f"seqvae: warning: data.{split} reads {root / 'corpus.txt'}#{lines}" in err
        assert f"but data.train is now {new} (the command line): give data.{split} for your file too" in err


class RunsCode:
    """Unpickling this runs a command: what a checkpoint from an untrusted source can carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("option", ["ckpt_path", "init_encoder_from", "vocab"])
def test_a_checkpoint_carrying_code_is_refused_and_nothing_runs(trained, tmp_path, capsys, option):
    root, run_dir = trained
    marker = tmp_path / "ran"
    state = torch.load(run_dir / "checkpoints" / "best.ckpt", weights_only=True)
    state["extra"] = RunsCode(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(state, evil)
    common = [f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.max_epochs=1", *TINY]
    data = [f"--data.train={root / 'corpus.txt'}", "--data.train_lines=1-80",
            "--data.val_lines=81-100", "--data.test_lines=101-120"]  # fmt: skip
    args = {
        "ckpt_path": ["test", f"--ckpt_path={evil}", *data, *common],
        "init_encoder_from": ["fit", f"--model.init_encoder_from={evil}", *data, *common],
        "vocab": ["fit", f"--data.vocab={evil}", *data, *common],  # (test without a --ckpt_path is refused before)
    }[option]
    status, err = run(args, capsys)
    assert status == 2
    lines = [x for x in err.splitlines() if x.startswith("seqvae: error:")]
    assert len(lines) == 1 and str(evil) in lines[0] and "refused" in lines[0], err
    assert not marker.exists()
    assert not (tmp_path / "runs").exists()  # refused before a run directory was made


def test_unk_token_hint():
    texts = [["a", "<unk>", "b"], ["<unk>", "c"], ["UNK"]]
    hint = unk_token_hint(texts, "_UNK")
    assert "'<unk>' occurs 2 times" in hint and "--data.unk_token '<unk>'" in hint
    assert unk_token_hint(texts, "<unk>") is None  # the configured token occurs
    assert unk_token_hint([["a", "b"]], "_UNK") is None  # no other spelling either: nothing to say
    # scoring a checkpoint: what the other spelling is read as, by the checkpoint's vocabulary
    vocab = {"<unk>": 3}
    assert "'<unk>' occurs 2 times: it is read as an ordinary word of the vocabulary" in unk_token_hint(texts, "_UNK", vocab.get)
    assert "it is read as unknown, as a word outside it" in unk_token_hint(texts, "_UNK", {}.get)


def test_datamodule_warns_once_about_the_unknown_token(tmp_path, capsys):
    write_corpus(tmp_path / "c.txt", 30, 0)
    with open(tmp_path / "c.txt", "a") as f:
        f.write("the <unk> sat\n<unk> ran\n")
    dm = TextDataModule(str(tmp_path / "c.txt"), unk_token="_UNK")
    err = capsys.readouterr().err
    assert err.count("seqvae: warning:") == 1 and "'<unk>' occurs 2 times" in err
    assert dm.vocab.tokenizer.token_to_id("<unk>") is not None  # an ordinary word, as the warning says
    TextDataModule(str(tmp_path / "c.txt"), unk_token="<unk>")
    assert "warning" not in capsys.readouterr().err


def test_label_column_hint_on_labelled_and_plain_files(tmp_path):
    labelled = tmp_path / "yelp.txt"
    labelled.write_text("5\tgreat food here\n1\tcold soup\nno label on this line\n")
    hint = label_column_hint(read_corpus(labelled), False)
    assert "2 of 3 lines" in hint and "'5'<TAB>text, first at line 1" in hint and "--data.label_column tab" in hint
    corpus = read_corpus(labelled, label_column=True)
    assert corpus.labels == ["5", "1", None] and corpus.texts[0] == ["great", "food", "here"]
    assert "1 of 3 lines hold no tab (first at line 3)" in label_column_hint(corpus, True)
    both = tmp_path / "both.txt"
    both.write_text("5\tgreat food here\n1\tcold soup\n")
    assert label_column_hint(read_corpus(both, label_column=True), True) is None
    # a few labelled lines among plain ones (a half-cleaned export) are still named
    few = tmp_path / "few.txt"
    few.write_text("plain text here\nmore plain text\npos\tlabelled one\nthe last plain line\n")
    hint = label_column_hint(read_corpus(few), False)
    assert "1 of 4 lines start with a label column ('pos'<TAB>text, first at line 3)" in hint
    # a tab inside running text (several words before it) is not a label column
    prose = tmp_path / "prose.txt"
    prose.write_text("the cat\tsat down\na dog\tran off\n")
    assert label_column_hint(read_corpus(prose), False) is None
    # ... and with label_column on, its first words would be dropped as a label: said, with the line
    hint = label_column_hint(read_corpus(prose, label_column=True), True)
    assert "on 2 of 2 lines the part before the tab is not one short label (first at line 1)" in hint
    assert "--data.label_column false" in hint
    plain = tmp_path / "plain.txt"
    plain.write_text("a b c\nd e\n")
    assert label_column_hint(read_corpus(plain), False) is None
    assert "no line holds a tab" in label_column_hint(read_corpus(plain, label_column=True), True)
    # both problems in one file: both said, in one line
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("5\tgood\npos neg\tdropped words\nno tab here\n")
    assert label_column_hint(read_corpus(mixed, label_column=True), True) == (
        f"{mixed}: data.label_column is tab but 1 of 3 lines hold no tab (first at line 3): they are read as text "
        "with no label; and on 1 of 3 lines the part before the tab is not one short label (first at line 2): it is "
        "dropped as the label; if the tab is part of the text, set --data.label_column false"
    )


def test_datamodule_warns_once_per_file_about_a_label_column(tmp_path, capsys):
    path = tmp_path / "yelp.txt"
    path.write_text("".join(f"{i % 5 + 1}\tword{i % 7} word{i % 3} end\n" for i in range(40)))
    dm = TextDataModule(str(path), train_lines="1-30", val_lines="31-35", test_lines="36-40")
    err = capsys.readouterr().err
    assert err.count("seqvae: warning:") == 1 and "data.train:" in err and "30 of 30 lines" in err, err
    assert dm.vocab.tokenizer.token_to_id("3") is not None  # the label became a word, as the warning says
    TextDataModule(str(path), train_lines="1-30", val_lines="31-35", test_lines="36-40", label_column=True)
    assert "warning" not in capsys.readouterr().err


def read_rows(path: Path) -> list[dict]:
    import csv

    with open(path) as f:
        return list(csv.DictReader(f))


def test_per_text_results_add_up_to_the_metrics_and_name_their_lines(trained, tmp_path, capsys):
    root, run_dir = trained
    out = metrics(run_dir)
    rows = read_rows(run_dir / out["per_text_file"])
    assert out["per_text_file"] == "per_text.csv" and len(rows) == out["data"]["test"]["texts"] == 20
    assert [int(r["index"]) for r in rows] == list(range(20))
    assert [int(r["line"]) for r in rows] == list(range(101, 121))  # lines of the file, not of the split
    corpus = (root / "corpus.txt").read_text().splitlines()
    assert [int(r["tokens"]) for r in rows] == [len(corpus[int(r["line"]) - 1].split()) + 1 for r in rows]
    mean = lambda key: sum(float(r[key]) for r in rows) / len(rows)  # noqa: E731
    assert mean("iw_nll") == pytest.approx(out["test/iw_nll"], rel=1e-5)
    assert mean("neg_elbo") == pytest.approx(out["test/loss"], rel=1e-5)
    assert mean("kl") == pytest.approx(out["test/kl"], rel=1e-4, abs=1e-5)
    assert all(float(r["iw_se"]) >= 0 for r in rows)
    assert out["test_texts_sha256"] == out["data"]["test"]["sha256"]
    assert out["seeds"] == {"seed_everything": 1, "data.seed": 1, "aggressive.seed": None, "eval_seed": 0}
    assert out["provenance"]["command"].startswith("seqvae fit ") and "torch" in out["provenance"]


def test_a_retest_writes_a_numbered_pair_and_keeps_the_first(trained, tmp_path, capsys):
    _, run_dir = trained
    work = tmp_path / "run"
    shutil.copytree(run_dir, work)
    first = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    args = ["test", f"--config={work / 'config.yaml'}", f"--ckpt_path={work / 'checkpoints' / 'best.ckpt'}",
            "--model.test_iw_samples=3", f"--trainer.logger.init_args.save_dir={tmp_path / 'x'}"]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    retest = tmp_path / "x" / "default" / "version_0"
    assert metrics(retest)["per_text_file"] == "per_text.csv"
    # Into the same directory (a user's own log dir): -2 for both, the first pair untouched.
    os.replace(retest / "metrics.json", work / "metrics-2.json")
    from seqvae.rundir.run_files import write_new_files

    written = write_new_files({work / "per_text.csv": "x\n", work / "metrics.json": "{}\n"})
    assert [p.name for p in written.values()] == ["per_text-3.csv", "metrics-3.json"]
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.name in first} == first


NOISE = ("💡 Tip", "LeafSpec", "The dirpath has changed", "You are using a custom batch sampler")


def test_no_console_noise_on_test_and_predict(trained, tmp_path):
    """Lightning's advert, its LeafSpec FutureWarning, the dirpath change of a checkpoint tested in
    a new directory and the custom-sampler note of predict: none is printed (a real subprocess,
    as a user sees it; pytest would capture warnings and log records in-process)."""
    import subprocess
    import sys

    root, run_dir = trained
    ckpt, texts = run_dir / "checkpoints" / "best.ckpt", root / "corpus.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    for sub in ("test", "predict"):
        done = subprocess.run(
            [sys.executable, "-m", "seqvae.cli", sub, f"--ckpt_path={ckpt}", f"--data.{sub}={texts}",
             "--model.test_iw_samples=2", f"--trainer.logger.init_args.save_dir={tmp_path}"],  # fmt: skip
            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert not [n for n in NOISE if n in done.stderr + done.stdout], done.stderr


def test_one_line_per_epoch_without_a_terminal(tmp_path, capsys):
    write_corpus(tmp_path / "c.txt", 60, 3)
    args = ["fit", f"--data.train={tmp_path / 'c.txt'}", "--model.test_iw_samples=0", "--trainer.max_epochs=2",
            f"--trainer.logger.init_args.save_dir={tmp_path}", *TINY]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    lines = [x for x in err.splitlines() if x.startswith("seqvae: epoch ")]
    assert [x.split()[2] for x in lines] == ["1/2", "2/2"], err
    curves = (tmp_path / "default" / "version_0" / "curves.csv").read_text().splitlines()
    assert len(curves) == 3 and "val/loss" in curves[0]  # every fit writes its validation curves
    assert all(" val/loss " in x and " kl_weight " in x and x.endswith(" s") for x in lines)


def test_epoch_line_shows_the_epochs_mean_train_loss_not_the_last_batchs(capsys):
    from types import SimpleNamespace

    import torch

    from seqvae.training.log_lines import EpochLine, EpochMean

    trainer = SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="fit"), is_global_zero=True,
                              callback_metrics={"train/loss": torch.tensor(1000.0)}, current_epoch=0, max_epochs=2)  # fmt: skip
    module = SimpleNamespace(train_loss_mean=EpochMean())
    line = EpochLine()
    line.on_train_epoch_start(trainer, module)
    for loss, texts in ((10.0, 2), (40.0, 1), (1000.0, 0)):  # an empty batch weighs nothing
        module.train_loss_mean.add(0, loss, texts)
    trainer.callback_metrics["val/loss"] = torch.tensor(7.0)
    line.on_validation_end(trainer, module)
    out = capsys.readouterr().err
    assert "seqvae: epoch 1/2  train/loss 20.00  val/loss 7.00  " in out, out  # (2·10 + 1·40) / 3
    trainer.current_epoch = 1  # a new epoch starts a new mean
    module.train_loss_mean.add(1, 5.0, 4)
    line.on_validation_end(trainer, module)
    assert "train/loss 5.00" in capsys.readouterr().err
    # kept in a checkpoint: the mean goes on where it stopped
    again = EpochMean()
    again.load_state_dict(module.train_loss_mean.state_dict())
    again.add(1, 11.0, 2)
    assert again.mean(1) == (4 * 5.0 + 2 * 11.0) / 6 and again.mean(0) is None


EXPECTED_PROGRESS = {
    # by length: (3, 3) 6 tokens, (5, 5) 10, (10, 10) 20 of 36; 100 s per batch
    "bucket": ["seqvae: test 16% (2/6 texts)  1:40 elapsed  ~8:20 left",  # 100 s · (30/36) / (6/36)
               "seqvae: test 44% (4/6 texts)  3:20 elapsed  ~4:10 left"],  # 200 s · (20/36) / (16/36)
    # file order, padded to the longest: (10, 3) 20 tokens, (5, 3) 10, (10, 5) 20 of 50
    "padded": ["seqvae: test 40% (2/6 texts)  1:40 elapsed  ~2:30 left",
               "seqvae: test 60% (4/6 texts)  3:20 elapsed  ~2:13 left"],
}  # fmt: skip


def progress_lines(monkeypatch, capsys, lengths, batching, batch_size, quiet_seconds):
    """TestProgress's lines over a test of texts of these lengths, 100 s per batch."""
    from types import SimpleNamespace

    import torch
    from torch.utils.data import DataLoader

    from seqvae.text.corpus import IndexedTexts, collate
    from seqvae.text.datamodule import SAMPLERS
    from seqvae.training import log_lines

    data = IndexedTexts([torch.full((n,), 7) for n in lengths])
    loader = DataLoader(data, batch_sampler=SAMPLERS[batching](lengths, batch_size, False), collate_fn=collate)
    trainer = SimpleNamespace(test_dataloaders=loader, is_global_zero=True)
    now = [0.0]
    monkeypatch.setattr(log_lines.time, "monotonic", lambda: now[0])
    progress = log_lines.TestProgress(quiet_seconds)
    progress.on_test_epoch_start(trainer, None)
    for i, batch in enumerate(loader):
        now[0] += 100.0
        progress.on_test_batch_end(trainer, None, None, batch, i)
    header, *lines = capsys.readouterr().err.splitlines()
    assert header == f"seqvae: test: {len(lengths)} texts, no IW-NLL (model.test_iw_samples 0)"  # no model: K 0
    return lines


@pytest.mark.parametrize("batching", ["bucket", "padded"])
def test_test_progress_counts_padded_tokens_not_texts(capsys, monkeypatch, batching):
    from seqvae.training.log_lines import clock

    lengths = [10, 3, 5, 3, 10, 5]
    lines = progress_lines(monkeypatch, capsys, lengths, batching, 2, 30.0)
    assert lines == EXPECTED_PROGRESS[batching]  # the last batch (100%) prints nothing: the metrics follow
    assert progress_lines(monkeypatch, capsys, lengths, batching, 2, 150.0) == lines[1:]  # quiet for 150 s
    # one line per tenth crossed: 44% and then 46% is one line, not two
    assert progress_lines(monkeypatch, capsys, [44, 2, 54], "padded", 1, 0.0) == [
        "seqvae: test 44% (1/3 texts)  1:40 elapsed  ~2:07 left"
    ]
    assert clock(3725) == "1:02:05"


def _has(acc, plugin: str) -> bool:
    try:
        return bool(acc.PluginTagToContent(plugin))
    except KeyError:  # no record of that plugin in this event file
        return False


def test_tensorboard_holds_hparams_with_test_metrics_and_text_samples(trained):
    """Read back with TensorBoard's own loader: the HPARAMS tab's records (settings, the test
    scalars named as metrics), per validation the TEXT entry with inputs, reconstructions and
    prior samples, and the per-dimension image of Var(E[z_d]) and KL_d."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    _, run_dir = trained
    hparams, texts, scalars, images = {}, [], set(), {}
    for events in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"tensors": 0, "scalars": 0, "images": 0})
        acc.Reload()
        scalars |= set(acc.Tags()["scalars"])
        for tag in acc.Tags()["images"]:
            images.setdefault(tag, []).extend(acc.Images(tag))
        plugins = acc.PluginTagToContent("hparams") if _has(acc, "hparams") else {}
        for tag, content in plugins.items():
            hparams[tag] = plugin_data_pb2.HParamsPluginData.FromString(content)
        texts += [t.tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"] if tag.startswith("val/samples")
                  for t in acc.Tensors(tag)]  # fmt: skip
    start = next(d.session_start_info for d in hparams.values() if d.HasField("session_start_info"))
    settings = {k: v.string_value or v.number_value for k, v in start.hparams.items()}
    assert settings["pooling"] == "max" and settings["latent_dim"] == 4 and settings["seed"] == 1
    assert settings["kl_schedule"] == "LinearKLWarmup(start=0.1, warmup_epochs=10.0)" and settings["aggressive"] == "off"
    experiment = next(d.experiment for d in hparams.values() if d.HasField("experiment"))
    named = {m.name.tag for m in experiment.metric_infos}
    assert {"test/iw_nll", "test/kl", "test/mi", "test/au"} <= named and named <= scalars  # metrics the tab can look up
    assert len(texts) == 1  # one validation epoch
    assert "| input | reconstruction |" in texts[0] and "from the prior" in texts[0]
    assert texts[0].count("\n| ") >= 8  # 4 inputs with their reconstructions, 4 prior samples
    # the per-dimension picture of what AU counts: once per validation, once for the test
    assert {tag: len(v) for tag, v in images.items()} == {"val/latent_dimensions": 1, "test/latent_dimensions": 1}
    assert images["test/latent_dimensions"][0].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_real_tensorboard_serves_the_hparams_text_and_image_data(trained):
    """A TensorBoard server on the run (in this process, a free port), asked over HTTP as its web
    page asks: the HPARAMS tab's experiment lists the settings and the test metrics, the TEXT tab
    the samples, the IMAGES tab the per-dimension picture."""
    import urllib.request

    from tensorboard import program

    _, run_dir = trained
    board = program.TensorBoard()
    board.configure(argv=[None, "--logdir", str(run_dir.parent), "--host", "127.0.0.1", "--port", "0", "--load_fast", "false"])
    url = board.launch()

    def get(path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "X-XSRF-Protected": "1"}
        with urllib.request.urlopen(urllib.request.Request(url + path, data=data, headers=headers), timeout=60) as r:
            return json.loads(r.read())

    experiment = get("data/plugin/hparams/experiment", {"experimentName": ""})
    assert {"pooling", "kl_schedule", "latent_dim", "seed"} <= {h["name"] for h in experiment["hparamInfos"]}
    assert {"test/iw_nll", "test/kl", "test/mi", "test/au"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert get("data/plugin/text/tags") == {"version_0": ["val/samples/text_summary"]}
    assert sorted(get("data/plugin/images/tags")["version_0"]) == ["test/latent_dimensions", "val/latent_dimensions"]
