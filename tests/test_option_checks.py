"""Out-of-range option values are refused when the model and the datamodule are built (before the
CLI writes anything), in one line that names the option as the user writes it, the value and
what is allowed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_model import write_corpus

from seqvae import (
    AggressiveTraining,
    BatchFreeBits,
    ConstantKL,
    CosineDispersion,
    CyclicalKL,
    FreeBits,
    LinearKLWarmup,
    SeqVAE,
    TextDataModule,
)
from seqvae.cli import run_lightning
from seqvae.core.generation import Generation
from seqvae.text.corpus import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY = dict(vocab_size=20, embed_dim=4, hidden_dim=4, latent_dim=2)

MODEL_CASES = {
    # case: (SeqVAE arguments besides TINY, the exact error message)
    "lr": ({"lr": -0.5}, "model.lr: must be > 0, got -0.5"),
    "lr_zero": ({"lr": 0.0}, "model.lr: must be > 0, got 0.0"),
    "lr_nan": ({"lr": math.nan}, "model.lr: must be > 0, got nan"),
    "grad_clip": ({"grad_clip": 0.0}, "model.grad_clip: must be > 0 (.inf: no clipping), got 0.0"),
    "latent_dim": ({"latent_dim": -2}, "model.latent_dim: must be >= 0, got -2"),
    "embed_dim": ({"embed_dim": 0}, "model.embed_dim: must be >= 1, got 0"),
    "hidden_dim": ({"hidden_dim": -1}, "model.hidden_dim: must be >= 1, got -1"),
    "encoder_hidden_dim": ({"encoder_hidden_dim": 0}, "model.encoder_hidden_dim: must be >= 1 (null: hidden_dim), got 0"),
    "dropout_in": ({"dropout_in": 1.5}, "model.dropout_in: must be in [0, 1], got 1.5"),
    "dropout_out": ({"dropout_out": -0.1}, "model.dropout_out: must be in [0, 1], got -0.1"),
    "word_dropout": ({"word_dropout": 2.0}, "model.word_dropout: must be in [0, 1], got 2.0"),
    "test_iw_samples": ({"test_iw_samples": -3}, "model.test_iw_samples: must be >= 0, got -3"),
    "val_iw_samples": ({"val_iw_samples": -1}, "model.val_iw_samples: must be >= 0, got -1"),
    "iw_max_elements": ({"iw_max_elements": 0}, "model.iw_max_elements: must be >= 1 (null: automatic), got 0"),
    "bn_gamma": ({"bn_gamma": 0.0}, "model.bn_gamma: must be > 0 (null: BN-VAE off), got 0.0"),
    "bn_eps": ({"bn_eps": -1e-5}, "model.bn_eps: must be > 0, got -1e-05"),
    "warmup_epochs": (
        {"kl_schedule": LinearKLWarmup(warmup_epochs=-1)},
        "model.kl_schedule.init_args.warmup_epochs: must be >= 0, got -1",
    ),
    "warmup_start": ({"kl_schedule": LinearKLWarmup(start=1.5)}, "model.kl_schedule.init_args.start: must be in [0, 1], got 1.5"),
    "constant_kl": ({"kl_schedule": ConstantKL(-1.0)}, "model.kl_schedule.init_args.value: must be >= 0, got -1.0"),
    "cycles": ({"kl_schedule": CyclicalKL(cycles=0)}, "model.kl_schedule.init_args.cycles: must be >= 1, got 0"),
    "cycle_ratio": ({"kl_schedule": CyclicalKL(ratio=0.0)}, "model.kl_schedule.init_args.ratio: must be in (0, 1], got 0.0"),
    "free_bits": ({"kl_penalty": FreeBits(target=-8.0)}, "model.kl_penalty.init_args.target: must be >= 0, got -8.0"),
    "batch_free_bits": ({"kl_penalty": BatchFreeBits(target=-1.0)}, "model.kl_penalty.init_args.target: must be >= 0, got -1.0"),
    "cosine": (
        {"regularizers": [CosineDispersion(0.5), CosineDispersion(-1.0)]},
        "model.regularizers[1].init_args.weight: must be >= 0, got -1.0",
    ),
    "aggressive_window": ({"aggressive": AggressiveTraining(window=0)}, "model.aggressive.init_args.window: must be >= 1, got 0"),
    "aggressive_steps": (
        {"aggressive": AggressiveTraining(max_inner_steps=0)},
        "model.aggressive.init_args.max_inner_steps: must be >= 1, got 0",
    ),
    "generation_n": ({"generation": Generation(mode="sample", n=0)}, "model.generation.n: must be >= 1, got 0"),
    "generation_steps": ({"generation": Generation(steps=1)}, "model.generation.steps: must be >= 2 (both ends), got 1"),
    "generation_max_length": ({"generation": Generation(max_length=-4)}, "model.generation.max_length: must be >= 1, got -4"),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_model_refuses_out_of_range_option(case):
    kwargs, message = MODEL_CASES[case]
    with pytest.raises(ConfigError) as err:
        SeqVAE(**{**TINY, **kwargs})
    assert str(err.value) == message


def test_model_accepts_the_edges_of_each_range():
    edges = dict(latent_dim=0, dropout_in=1.0, dropout_out=0.0, word_dropout=1.0, val_iw_samples=0, test_iw_samples=0)
    edges.update(grad_clip=math.inf, iw_max_elements=1, encoder_hidden_dim=1, bn_gamma=1e-3, bn_eps=1e-10)
    SeqVAE(**{**TINY, **edges})
    strategies = dict(kl_schedule=LinearKLWarmup(start=1.0, warmup_epochs=0), kl_penalty=FreeBits(0.0))
    strategies.update(regularizers=[CosineDispersion(0.0)], aggressive=AggressiveTraining(max_inner_steps=1, window=1))
    SeqVAE(**TINY, **strategies)
    SeqVAE(**TINY, kl_schedule=CyclicalKL(cycles=1, ratio=1.0), kl_penalty=BatchFreeBits(0.0))
    SeqVAE(**TINY, kl_schedule=ConstantKL(0.0))
    SeqVAE(**TINY, generation=Generation(n=1, steps=2, max_length=1))


DATA_CASES = {
    "batch_size": ({"batch_size": -4}, "data.batch_size: must be >= 1, got -4"),
    "eval_batch_size": ({"eval_batch_size": 0}, "data.eval_batch_size: must be >= 1, got 0"),
    "num_workers": ({"num_workers": -1}, "data.num_workers: must be >= 0, got -1"),
    "min_freq": ({"min_freq": -1}, "data.min_freq: must be >= 0, got -1"),
    "max_vocab": ({"max_vocab": 0}, "data.max_vocab: must be >= 1 (null: no limit), got 0"),
    "max_length": ({"max_length": 0}, "data.max_length: must be >= 1 (null: no limit), got 0"),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_datamodule_refuses_out_of_range_option_before_reading_files(case, tmp_path):
    kwargs, message = DATA_CASES[case]
    with pytest.raises(ConfigError) as err:  # a missing file would be a CorpusError: not read
        TextDataModule(train=str(tmp_path / "no_such_file.txt"), **kwargs)
    assert str(err.value) == message


def test_datamodule_accepts_the_edges_of_each_range(tmp_path):
    write_corpus(tmp_path / "train.txt", 20, 0, min_len=1, max_len=1)  # one-word texts: max_length 1 keeps them
    TextDataModule(train=str(tmp_path / "train.txt"), batch_size=1, eval_batch_size=1, min_freq=0, max_vocab=1, max_length=1)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--model.lr", "-0.5", "model.lr: must be > 0, got -0.5"),
        ("--data.batch_size", "-4", "data.batch_size: must be >= 1, got -4"),
        # A nested class's own error would reach the user wrapped by jsonargparse: SeqVAE checks it.
        (
            "--model.kl_schedule.init_args.warmup_epochs",
            "-1",
            "model.kl_schedule.init_args.warmup_epochs: must be >= 0, got -1.0",
        ),
    ],
)
def test_cli_refuses_bad_value_in_one_line_and_writes_nothing(option, value, message, tmp_path, monkeypatch, capsys):
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 40, seed)
    before = sorted(tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)  # anything written relative to the working directory lands here too
    args = [
        "fit", f"--config={CONFIGS / 'demo.yaml'}",
        f"--data.train={tmp_path / 'train.txt'}", f"--data.val={tmp_path / 'valid.txt'}", f"--data.test={tmp_path / 'test.txt'}",
        "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4", "--model.test_iw_samples=2",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--trainer.max_epochs=1", option, value,
    ]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        run_lightning(args)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"seqvae: error: {message}"
    assert sorted(tmp_path.iterdir()) == before  # no run directory (nor anything else) was written


def test_cli_names_an_out_of_range_value_before_reading_data(tmp_path, monkeypatch, capsys):
    """The range error comes first, not the error of a data file the run would then read."""
    monkeypatch.chdir(tmp_path)
    args = [
        "fit", f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tmp_path / 'missing.txt'}",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}", "--model.lr", "-0.5",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        run_lightning(args)
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "seqvae: error: model.lr: must be > 0, got -0.5"
    assert not (tmp_path / "runs").exists()
