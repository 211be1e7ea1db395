"""The ELBO's two terms of a batch, computed in one place.

Training's loss (`SeqVAE.loss_terms`), evaluation's −ELBO and KL (`evaluation.evaluate_batch`),
the Python API's `elbo` (`scoring.py`) and SA-VAE's inner objective (`refinement.py`) all call
`elbo_terms`, so a change to the ELBO is made here once (tests/test_elbo.py moves each caller with
it). The language model is the posterior None: its rec is the exact −log p(x) and its KL 0.
Callers reach the function through this module (`elbo.elbo_terms`), the name the test patches.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class ELBOTerms(NamedTuple):
    """rec (B,): −log p(x|z) at one z per text; kl_dims: the KL's terms (`kl_terms()`: (B, Z), or
    (B, 1) for a posterior whose KL does not split over dimensions), what a KL penalty gets."""

    rec: torch.Tensor
    kl_dims: torch.Tensor

    @property
    def kl(self) -> torch.Tensor:
        """KL(q(z|x) ‖ p(z)) per text, (B,)."""
        return self.kl_dims.sum(-1)

    def neg_elbo(self, kl_weight: float = 1.0) -> torch.Tensor:
        """rec + w·KL per text, (B,); w = 1: the negative ELBO."""
        return self.rec + kl_weight * self.kl


def encode(encoder, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple:
    """The batch's posteriors and encoder features (q, h); (None, None) for the language model (no encoder)."""
    return (None, None) if encoder is None else encoder.encode(tokens, lengths)


def elbo_terms(decoder, q, tokens, lengths, inputs=None, z=None, generator=None, summed: bool = False) -> ELBOTerms:
    """The ELBO's terms of a batch under the posteriors `q` (None: the language model, KL 0).

    z (B, 1, Z): the draw to decode, where the caller needs it too (training's KL penalty) or makes
    it from its own noise (SA-VAE's steps); else one is drawn from q with `generator` (None: the
    global one). A flow's KL uses the draw, so it is taken after it. `inputs`: the decoder's input
    ids (word dropout); `summed`: the caller sums or means the values (`LSTMDecoder.log_likelihood`).
    """
    if q is not None and z is None:
        z = q.sample(1, generator)
    rec = -decoder.log_likelihood(tokens, lengths, z, inputs, summed=summed)[:, 0]
    kl_dims = rec.new_zeros(rec.shape + (1,)) if q is None else q.kl_terms()
    return ELBOTerms(rec, kl_dims)


__all__ = ["ELBOTerms", "elbo_terms", "encode"]
