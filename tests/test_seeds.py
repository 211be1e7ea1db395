"""The run's seed (`seed_everything`) varies everything a run draws: initial weights, training
noise, the batch order and aggressive training's inner batches. Seeds left unset take it; an
explicit value wins; the effective values are in the config the run saves."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from test_configs import CONFIGS, build, tiny  # noqa: F401  (fixture)

from seqvae import AggressiveTraining


def first_batches(dm, n=3):
    loader = dm.train_dataloader()
    loader.batch_sampler.set_epoch(0)
    return [b["tokens"] for _, b in zip(range(n), loader)]


def test_seed_everything_sets_the_batch_order_and_aggressive_seed(tiny, tmp_path):  # noqa: F811
    configs = [CONFIGS / "yahoo10k/base.yaml", CONFIGS / "yahoo10k/aggressive.yaml"]
    runs = {s: build(configs, tiny, tmp_path, [f"--seed_everything={s}"]) for s in (1, 2)}
    for s, cli in runs.items():
        assert cli.config["data"]["seed"] == s  # what config.yaml records
        assert cli.config["model"]["aggressive"]["init_args"]["seed"] == s
        assert cli.datamodule.hparams.seed == s and cli.model.aggressive.seed == s
    a, b = (first_batches(runs[s].datamodule) for s in (1, 2))
    assert any(x.shape != y.shape or not torch.equal(x, y) for x, y in zip(a, b))
    again = build(configs, tiny, tmp_path, ["--seed_everything=2"])
    assert all(torch.equal(x, y) for x, y in zip(b, first_batches(again.datamodule)))  # same seed, same order
    draws = [[r.model.aggressive.rng.random() for _ in range(3)] for r in (runs[1], again)]
    assert draws[0] != draws[1]


def test_an_explicit_seed_wins(tiny, tmp_path):  # noqa: F811
    configs = [CONFIGS / "yahoo10k/base.yaml", CONFIGS / "yahoo10k/aggressive.yaml"]
    cli = build(configs, tiny, tmp_path, ["--seed_everything=3", "--data.seed=11", "--model.aggressive.init_args.seed=12"])
    assert cli.datamodule.hparams.seed == 11 and cli.model.aggressive.seed == 12
    assert cli.config["data"]["seed"] == 11


def test_python_api_defaults_follow_the_global_seed():
    pl.seed_everything(5)
    assert AggressiveTraining().seed == 5
    assert AggressiveTraining(seed=0).seed == 0
    pl.seed_everything(6)
    assert AggressiveTraining().seed == 6


@pytest.mark.parametrize("seed", [1, 2])
def test_same_seed_same_draws(seed):
    pl.seed_everything(seed)
    a = AggressiveTraining().rng.random()
    pl.seed_everything(seed)
    assert AggressiveTraining().rng.random() == a


def test_eval_seed_reaches_the_dataset_mi():
    """`model.eval_seed` seeds all evaluation noise: the dataset MI's z draws too."""
    import torch

    from seqvae import SeqVAE

    mu, logvar = torch.randn(40, 3), torch.randn(40, 3) * 0.1 - 1
    values = []
    for seed in (0, 0, 5):
        model = SeqVAE(vocab_size=12, embed_dim=4, hidden_dim=6, latent_dim=3, eval_seed=seed)
        for m in (model.val_metrics, model.test_metrics):
            assert m.seed == seed
        m = model.val_metrics
        m.update(torch.zeros(40), torch.zeros(40), torch.ones(40), mu, logvar, torch.randn(40, 6), index=torch.arange(40))
        values.append(float(m.compute()["mi_dataset"]))
    assert values[0] == values[1] != values[2]
