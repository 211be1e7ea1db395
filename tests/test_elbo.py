"""The ELBO's terms are computed in one place (`seqvae/core/elbo.py`): shifting the rec that
`elbo_terms` returns by exactly 1 nat moves training's loss, evaluation's −ELBO (`loss`, `rec`,
per-text `neg_elbo`), the Python API's `elbo` and SA-VAE's inner objective by 1 and nothing else;
a caller that computed its own rec or KL would not move. The language model (no posterior) too."""

from __future__ import annotations

import pytest
import torch

from seqvae import SeqVAE, SVIRefinement
from seqvae.core import elbo
from seqvae.core.evaluation import EvalNoise, evaluate_batch
from seqvae.core.scoring import text_batches
from seqvae.text.corpus import Vocabulary

WORDS = "the a cat dog sat ran on under mat rug".split()
TEXTS = ["the cat sat on the mat", "a dog ran", "the dog sat under a rug on the mat", "cat"]
SHIFT = 1.0


def tiny_model(latent_dim: int = 4) -> SeqVAE:
    vocab = Vocabulary.build([WORDS])
    torch.manual_seed(0)
    model = SeqVAE(vocab_size=len(vocab), embed_dim=8, hidden_dim=12, latent_dim=latent_dim, word_dropout=0.3)
    model.vocab = vocab
    return model


def batch_of(model: SeqVAE) -> dict:
    """The texts as one batch, with the dataset positions a per-text evaluation needs."""
    return next(text_batches(model, TEXTS, len(TEXTS))) | {"index": torch.arange(len(TEXTS))}


@pytest.fixture
def shift_rec(monkeypatch):
    """Turns on the +1 nat shift of every rec `elbo.elbo_terms` returns."""
    original = elbo.elbo_terms

    def shifted(*args, **kwargs):
        terms = original(*args, **kwargs)
        return elbo.ELBOTerms(terms.rec + SHIFT, terms.kl_dims)

    return lambda: monkeypatch.setattr(elbo, "elbo_terms", shifted)


def training_terms(model: SeqVAE) -> dict:
    model.train()
    torch.manual_seed(3)  # the same word dropout, dropout masks and z in both calls
    with torch.no_grad():
        return {k: float(v) for k, v in model.loss_terms(batch_of(model), 0.7).items()}


def evaluation(model: SeqVAE) -> tuple[dict, dict]:
    model.eval()
    metrics = model.test_metrics
    metrics.reset()
    model._noise = EvalNoise(0, model.device, model.hparams.latent_dim)
    with torch.inference_mode():
        evaluate_batch(model, batch_of(model), metrics, n_iw=3)
        rows = metrics.per_text_rows()
        return {k: float(v) for k, v in metrics.compute().items()}, rows


@pytest.mark.parametrize("latent_dim", [4, 0], ids=["vae", "language_model"])
def test_training_loss_moves_with_elbo_terms(shift_rec, latent_dim):
    model = tiny_model(latent_dim)
    before = training_terms(model)
    shift_rec()
    after = training_terms(model)
    assert after["loss"] - before["loss"] == pytest.approx(SHIFT, abs=1e-5)
    assert after["rec"] - before["rec"] == pytest.approx(SHIFT, abs=1e-5)
    assert after.get("kl") == before.get("kl")


@pytest.mark.parametrize("latent_dim", [4, 0], ids=["vae", "language_model"])
def test_evaluation_metrics_move_with_elbo_terms(shift_rec, latent_dim):
    model = tiny_model(latent_dim)
    before, rows_before = evaluation(model)
    shift_rec()
    after, rows_after = evaluation(model)
    for key in ("loss", "rec"):
        assert after[key] - before[key] == pytest.approx(SHIFT, abs=1e-5)
    assert after["kl"] == before["kl"]
    torch.testing.assert_close(
        rows_after["neg_elbo"] - rows_before["neg_elbo"], torch.full((len(TEXTS),), SHIFT, dtype=torch.float64)
    )
    torch.testing.assert_close(rows_after["kl"], rows_before["kl"], rtol=0, atol=0)
    if latent_dim:  # the VAE's IW-NLL is not the ELBO; the language model's is its exact NLL, its rec
        assert after["iw_nll"] == before["iw_nll"]


@pytest.mark.parametrize("latent_dim", [4, 0], ids=["vae", "language_model"])
def test_python_api_elbo_moves_with_elbo_terms(shift_rec, latent_dim):
    model = tiny_model(latent_dim)
    torch.manual_seed(5)
    before = model.elbo(TEXTS)
    shift_rec()
    torch.manual_seed(5)
    after = model.elbo(TEXTS)
    torch.testing.assert_close(after - before, torch.full((len(TEXTS),), SHIFT))


def test_svi_objective_moves_with_elbo_terms(shift_rec):
    model = tiny_model().eval()
    b = batch_of(model)
    q, _ = model.encoder.encode(b["tokens"], b["lengths"])
    mu, logvar = q.params()
    eps = torch.randn(mu.shape, generator=torch.Generator().manual_seed(1))
    objective = lambda: float(SVIRefinement().objective(model, b["tokens"], b["lengths"], None, mu, logvar, eps, 0.7))  # noqa: E731
    before = objective()
    shift_rec()
    assert objective() - before == pytest.approx(SHIFT, abs=1e-5)
