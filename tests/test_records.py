"""Issue 45: the records say what ran. A resume with settings that change what is computed is
refused; the language model (latent_dim 0) with an option that needs z is refused before a run
directory exists; a refused command leaves no run directory; the Python API reads text as the
checkpoint recorded; a re-test's config.yaml records the checkpoint's values; a bad choice of a
Union option is one line. Every command runs through the CLI's entry point (`seqvae.commands.main`)
in this process, on tiny files written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_model import write_corpus
from test_scoring import run

from seqvae.commands import main

DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("records")
    write_corpus(root / "train.txt", 60, 0)
    write_corpus(root / "valid.txt", 20, 1)
    write_corpus(root / "test.txt", 20, 2)
    return root


def tiny(root: Path, save_dir: Path, *extra) -> list[str]:
    """`seqvae fit` arguments: demo.yaml (BN-VAE) shrunk to a few seconds on the files in `root`."""
    return ["fit", "--config", DEMO, f"--data.train={root / 'train.txt'}", f"--data.val={root / 'valid.txt'}",
            f"--data.test={root / 'test.txt'}", "--data.batch_size=16", "--model.embed_dim=8", "--model.hidden_dim=12",
            "--model.latent_dim=4", "--model.val_iw_samples=0", "--model.test_iw_samples=2", "--trainer.max_epochs=1",
            "--trainer.num_sanity_val_steps=0", "--trainer.enable_model_summary=false", "--trainer.enable_progress_bar=false",
            f"--trainer.logger.init_args.save_dir={save_dir}", *extra]  # fmt: skip


def one_error_line(status, err) -> str:
    assert status == 2, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("seqvae: error: "), err
    return last.removeprefix("seqvae: error: ")


# ---------------------------------------------------------------- item 10: a bad Union choice
@pytest.mark.parametrize(
    "option, expected",
    [
        ("--data.label_column=foo", "data.label_column: expected true, false, tab, first_token, null; got 'foo'"),
        ("--model.bn_gamma=foo", "model.bn_gamma: expected a number or null; got 'foo'"),
    ],
)
def test_a_bad_union_choice_is_one_short_line_naming_what_is_allowed(corpus, tmp_path, capsys, option, expected):
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", option), capsys))
    assert line == expected
    assert not (tmp_path / "runs").exists()


# ------------------------------------------- a class given by class_path: its name, options, values
@pytest.mark.parametrize(
    "option, expected",
    [
        ("--model.kl_schedule=seqvae.LinearKLWarmp",
         "model.kl_schedule: no class seqvae.LinearKLWarmp (did you mean seqvae.LinearKLWarmup?)"),
        ("--model.kl_schedule=seqvae.Nothing",
         "model.kl_schedule: no class seqvae.Nothing (a subclass of KLSchedule is expected)"),
        ("--model.kl_schedule.init_args.warmup_epoch=3",
         "model.kl_schedule.init_args.warmup_epoch: seqvae.LinearKLWarmup has no option 'warmup_epoch' "
         "(did you mean warmup_epochs?)"),
        ("--model.kl_schedule.init_args.warmup_epochs=x",
         "model.kl_schedule.init_args.warmup_epochs: expected a number; got 'x' (seqvae.LinearKLWarmup)"),
        ("--model.hiden_dim=3", "unrecognized arguments: --model.hiden_dim=3 (did you mean --model.hidden_dim?)"),
        ("--trainer.logger.init_args.save_dirr=x",  # a Union of three (a logger, a list of them, a bool)
         "trainer.logger.init_args.save_dirr: pytorch_lightning.loggers.TensorBoardLogger has no option 'save_dirr' "
         "(did you mean save_dir?)"),
        ("--trainer.logger.init_args.max_queue=abc",  # passed on untyped: a TypeError in the writer's thread
         "trainer.logger.init_args.max_queue: expected a number; got 'abc' (tensorboard's SummaryWriter)"),
    ],
)  # fmt: skip
def test_a_bad_class_option_names_the_option_and_what_is_wrong(corpus, tmp_path, capsys, option, expected):
    # Before: the first three read `model.kl_schedule: expected …KLSchedule or null; got "NestedArg(key=…)"`
    # (or jsonargparse's 350-character dump), naming neither the option refused nor why.
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", option), capsys))
    assert line == expected
    assert not (tmp_path / "runs").exists()


def test_every_misspelt_option_gets_its_nearest_name(corpus, tmp_path, capsys):
    # Before: only the first unknown option had a suggestion.
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", "--model.hiden_dim=3", "--model.laten_dim=2"), capsys))
    assert line == (
        "unrecognized arguments: --model.hiden_dim=3 --model.laten_dim=2 "
        "(did you mean --model.hidden_dim, --model.latent_dim?)"
    )
    assert not (tmp_path / "runs").exists()


def test_a_misspelt_init_arg_in_a_config_file_names_the_file(corpus, tmp_path, capsys):
    bad = tmp_path / "schedule.yaml"
    bad.write_text("model:\n  kl_schedule:\n    class_path: seqvae.LinearKLWarmup\n    init_args: {warmup_epoch: 3}\n")
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", "--config", str(bad)), capsys))
    assert line == (
        "model.kl_schedule.init_args.warmup_epoch: seqvae.LinearKLWarmup has no option 'warmup_epoch' "
        f"(did you mean warmup_epochs?) (in --config {bad})"
    )
    assert not (tmp_path / "runs").exists()


def test_a_misspelt_option_of_a_class_inside_a_class_names_the_whole_path(corpus, tmp_path, capsys):
    # Before: "model.posterior: seqvae.PlanarFlowPosterior: Parser key "mmd": Does not validate … Errors:" (the reason cut off)
    bad = tmp_path / "rnf.yaml"
    bad.write_text(
        "model:\n  posterior:\n    class_path: seqvae.PlanarFlowPosterior\n    init_args:\n      flows: 1\n"
        "      mmd: {class_path: seqvae.MMDPenalty, init_args: {wieght: 10.0}}\n"
    )
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", "--config", str(bad)), capsys))
    assert line == (
        "model.posterior.init_args.mmd.init_args.wieght: seqvae.MMDPenalty has no option 'wieght' (did you mean weight?) "
        f"(in --config {bad})"
    )
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- item 2: the language model and z
@pytest.mark.parametrize(
    "options, named",
    [
        ([], "model.bn_gamma"),  # demo.yaml's BN-VAE
        (["--model.bn_gamma=null", "--model.aggressive=seqvae.AggressiveTraining"], "model.aggressive"),
        (["--model.bn_gamma=null", "--model.kl_penalty=seqvae.FreeBits", "--model.kl_penalty.target=8"], "model.kl_penalty"),
        (["--model.bn_gamma=null", "--model.skip=true"], "model.skip"),
        (["--model.bn_gamma=null", "--model.regularizers+=seqvae.CosineDispersion"], "model.regularizers"),
        (["--model.bn_gamma=null", "--model.init_encoder_from=x.ckpt"], "model.init_encoder_from"),
        (["--model.bn_gamma=null", "--model.encoder=seqvae.TransformerEncoder"], "model.encoder"),
    ],
)
def test_the_language_model_refuses_options_that_need_z_before_a_run_directory(corpus, tmp_path, capsys, options, named):
    # Before: every such run gave the LM's numbers with the option recorded (aggressive: KeyError 'val/mi').
    line = one_error_line(*run(tiny(corpus, tmp_path / "runs", "--model.latent_dim=0", *options), capsys))
    assert line.startswith("model.latent_dim 0 is the language model (no encoder, no z), which ") and named in line
    assert not (tmp_path / "runs").exists()


def test_the_language_model_with_word_dropout_trains(corpus, tmp_path, capsys):
    status, err = run(tiny(corpus, tmp_path / "runs", "--model.latent_dim=0", "--model.bn_gamma=null",
                           "--model.word_dropout=0.3"), capsys)  # fmt: skip
    assert status == 0, err
    saved = yaml.safe_load((tmp_path / "runs" / "demo" / "version_0" / "config.yaml").read_text())
    assert saved["model"]["latent_dim"] == 0 and saved["model"]["word_dropout"] == 0.3


# ---------------------------------------------------------------- a run on labelled text, shared below
@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """A run trained on `label<TAB>text` lines (data.label_column tab): (root, run directory)."""
    root = tmp_path_factory.mktemp("labelled")
    for name, n, seed in (("train", 60, 0), ("valid", 20, 1), ("test", 20, 2)):
        lines = write_corpus(root / f"{name}.txt", n, seed)
        (root / f"{name}.txt").write_text("".join(f"{i % 3}\t{t}\n" for i, t in enumerate(lines)))
    main(tiny(root, root / "runs", "--data.label_column=tab"))  # a SystemExit fails the tests that use it
    return root, root / "runs" / "demo" / "version_0"


def test_stage_2_with_an_encoder_of_another_vocabulary_leaves_no_run_directory(labelled, tmp_path, capsys):
    root, stage1 = labelled
    stage2 = [*tiny(root, tmp_path / "runs", "--data.label_column=tab"), f"--model.init_encoder_from={stage1}/checkpoints/best.ckpt"]
    # the same words at other ids: each word as often as it is rare in stage 1's vocabulary
    ids = json.loads((stage1 / "vocab.json").read_text())["tokenizer"]["model"]["vocab"]
    words = [w for w, i in sorted(ids.items(), key=lambda x: x[1]) if i > 3]
    (tmp_path / "other.txt").write_text("".join(f"0\t{(w + ' ') * (k + 1)}\n" for k, w in enumerate(words)))
    line = one_error_line(*run([*stage2, f"--data.train={tmp_path / 'other.txt'}"], capsys))
    assert line.startswith("model.init_encoder_from: ") and "another vocabulary" in line
    assert not (tmp_path / "runs").exists()  # before: config.yaml, vocab.json and events were left there
    status, err = run(stage2, capsys)  # the corrected command runs (before: "already holds a run")
    assert status == 0, err
    assert (tmp_path / "runs" / "demo" / "version_0" / "metrics.json").is_file()


@pytest.mark.parametrize("lines, expected", [(3, "interpolate reads pairs of lines; the predict texts have 3"),
                                             (None, "data.predict: no input texts")])  # fmt: skip
def test_a_refused_predict_leaves_no_run_directory(labelled, tmp_path, capsys, lines, expected):
    _, stage1 = labelled
    args = ["predict", f"--ckpt_path={stage1}/checkpoints/best.ckpt", "--model.generation.mode=interpolate",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}"]  # fmt: skip
    if lines is not None:
        (tmp_path / "pairs.txt").write_text("the cat\nthe dog\na red fish\n")
        args.append(f"--data.predict={tmp_path / 'pairs.txt'}")
    line = one_error_line(*run(args, capsys))
    assert expected in line
    assert not (tmp_path / "runs").exists()  # before: a version_N per try


# ---------------------------------------------------------------- item 4: the Python API on a labelled checkpoint
def test_the_python_api_reads_lines_as_the_labelled_checkpoint_did(labelled, tmp_path, capsys):
    import csv

    import torch

    from seqvae import SeqVAE

    root, stage1 = labelled
    ckpt = stage1 / "checkpoints" / "best.ckpt"
    status, err = run(["test", f"--ckpt_path={ckpt}", f"--data.test={root / 'test.txt'}", "--model.test_iw_samples=100",
                       f"--trainer.logger.init_args.save_dir={tmp_path}"], capsys)  # fmt: skip
    assert status == 0, err
    with open(tmp_path / "default" / "version_0" / "per_text.csv") as f:
        cli = [float(row["iw_nll"]) for row in csv.DictReader(f)]
    lines = (root / "test.txt").read_text().splitlines()  # `1<TAB>the cat …`, as `seqvae test` read them
    model = SeqVAE.load_from_checkpoint(ckpt, map_location="cpu")
    torch.manual_seed(0)
    api = model.iw_nll(lines, n_samples=100)
    torch.manual_seed(0)
    by_hand = model.iw_nll([line.split("\t", 1)[1] for line in lines], n_samples=100)
    assert torch.equal(api, by_hand)  # the labels are not scored as words (before: one more unknown word each)
    assert len(cli) == len(lines) and abs(api.mean().item() - sum(cli) / len(cli)) < 0.3


# ---------------------------------------------------------------- item 5: a re-test records what it used
def test_a_retest_records_the_checkpoints_settings_and_says_which_it_decided(labelled, tmp_path, capsys):
    root, stage1 = labelled
    args = ["test", f"--ckpt_path={stage1 / 'checkpoints' / 'best.ckpt'}", f"--data.test={root / 'test.txt'}",
            "--model.latent_dim=8", "--model.pooling=last", "--data.unk_token=_UNK", "--model.test_iw_samples=3",
            f"--trainer.logger.init_args.save_dir={tmp_path}"]  # fmt: skip
    status, err = run(args, capsys)
    assert status == 0, err
    said = [line for line in err.splitlines() if line.startswith("seqvae: the checkpoint decides ")]
    assert said == ["seqvae: the checkpoint decides data.unk_token (_UNK given, <unk> used), model.latent_dim (8 given, "
                    "4 used), model.pooling (last given, max used): config.yaml records the checkpoint's values"]  # fmt: skip
    saved = yaml.safe_load((tmp_path / "default" / "version_0" / "config.yaml").read_text())
    assert (saved["model"]["latent_dim"], saved["model"]["pooling"], saved["data"]["unk_token"]) == (4, "max", "<unk>")
    assert saved["model"]["test_iw_samples"] == 3  # an evaluation setting: the command's
    # the run's own config.yaml gives the checkpoint's values: nothing to say
    status, err = run(["test", f"--config={stage1 / 'config.yaml'}", *args[1:3], f"--trainer.logger.init_args.save_dir={tmp_path}"],
                      capsys)  # fmt: skip
    assert status == 0 and "the checkpoint decides" not in err, err
