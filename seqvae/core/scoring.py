"""The Python API's scoring of texts with a trained SeqVAE: posterior parameters, encoder
features, −ELBO and IW-NLL per text (the model's `encode`, `features`, `elbo` and `iw_nll`
delegate here). Texts are whitespace-tokenised strings, read as the checkpoint read its training
lines (a label taken off, `words_as_read`); any number, input order kept; evaluation
mode (no dropout) and no autograd, the model's previous mode restored afterwards.
"""

from __future__ import annotations

import contextlib

import torch

from seqvae.core import elbo as elbo_module  # module access: the name tests/test_elbo.py patches
from seqvae.core.metrics import iw_nll_from_weights, posterior_iw_log_weights
from seqvae.text.corpus import collate, label_format


def words_as_read(model, text: str | list[str]) -> list[str]:
    """A text's words as the checkpoint's training text was read (its vocabulary's saved
    `label_column`): `label<TAB>text` loses the part before the tab, `label text` its first
    token, as `seqvae test` reads a file's lines (else the label was scored as a word). A list of
    words is taken as already read (the training loop's own texts)."""
    if not isinstance(text, str):
        return list(text)
    labels = label_format((model.vocab.reading or {}).get("label_column", False))
    if labels == "tab" and "\t" in text:
        text = text.split("\t", 1)[1]
    words = text.split()
    return words[1:] if labels == "first_token" else words


def text_batches(model, texts: list[str], batch_size: int):
    """Batches of the texts' ids on the model's device, in input order; words unknown to the
    checkpoint's vocabulary read as its unknown token."""
    if model.vocab is None:
        raise RuntimeError("this model has no vocabulary: load it from a checkpoint or train it first")
    ids = model.vocab.encode([words_as_read(model, t) for t in texts])
    for s in range(0, len(ids), batch_size):
        batch = collate([torch.tensor(x) for x in ids[s : s + batch_size]])
        yield {k: v.to(model.device) for k, v in batch.items()}


@contextlib.contextmanager
def inference(model):
    """Eval mode (no dropout) and no autograd, restoring the previous mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def per_batch(model, texts, batch_size: int, fn) -> list:
    with inference(model):
        return [fn(b) for b in text_batches(model, list(texts), batch_size)]


def posterior(model, tokens: torch.Tensor, lengths: torch.Tensor, generator: torch.Generator | None = None):
    """q(z|x) as `seqvae test` scores a text: the encoder's, then SA-VAE's SVI steps where the model
    has them (`model.refine`, at KL weight 1; their noise from `generator`, else the global random
    stream: the API has no evaluation seed), so that the API's posteriors, −ELBO, IW-NLL and
    reconstructions are those of the model that was tested. None for the language model."""
    q, _ = elbo_module.encode(model.encoder, tokens, lengths)
    if q is not None and getattr(model, "refine", None) is not None:
        q = model.refine.evaluated(model, q, tokens, lengths, generator)
    return q


def features(model, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    if model.encoder is None:
        raise RuntimeError("the language model has no encoder")
    outs = per_batch(model, texts, batch_size, lambda b: model.encoder.features(b["tokens"], b["lengths"]))
    return torch.cat(outs) if outs else torch.empty(0, model.encoder.lstm.hidden_size)


def encode(model, texts: list[str], batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The posteriors' parameters (`params()`: mu, logvar for the default Gaussian), mu first; an
    SA-VAE's after its SVI steps (`posterior`)."""
    if model.encoder is None:
        raise RuntimeError("the language model has no encoder")
    outs = per_batch(model, texts, batch_size, lambda b: posterior(model, b["tokens"], b["lengths"]))
    z = model.hparams.latent_dim
    if not outs:
        return torch.empty(0, z), torch.empty(0, z)
    shared = getattr(outs[0], "shared_params", ())  # one every text has in common (FullCovGaussian's L): not stacked
    params = [q.params() for q in outs]
    return tuple(params[0][i] if i in shared else torch.cat([p[i] for p in params]) for i in range(len(params[0])))


def elbo(model, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    def fn(b):
        q = posterior(model, b["tokens"], b["lengths"])
        return elbo_module.elbo_terms(model.decoder, q, b["tokens"], b["lengths"]).neg_elbo()

    outs = per_batch(model, texts, batch_size, fn)
    return torch.cat(outs) if outs else torch.empty(0)


def iw_nll(model, texts: list[str], n_samples: int = 500, batch_size: int = 16) -> torch.Tensor:
    def fn(b):
        tokens, lengths = b["tokens"], b["lengths"]
        q = posterior(model, tokens, lengths)
        if q is None:  # the language model: its NLL is exact
            return elbo_module.elbo_terms(model.decoder, None, tokens, lengths).rec
        ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
        return iw_nll_from_weights(posterior_iw_log_weights(ll, q, n_samples, model.iw_chunk(tokens)))

    outs = per_batch(model, texts, batch_size, fn)
    return torch.cat(outs) if outs else torch.empty(0)
