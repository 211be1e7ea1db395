"""The Python API of a trained model: the methods `SeqVAE` inherits for scoring texts (`scoring.py`)
and decoding them (`generation.py`), thin calls into those modules; see docs/python-api.md.
"""

from __future__ import annotations

import torch

from seqvae.core import generation, scoring
from seqvae.core.generation import Decoding


class PythonAPI:
    """Scoring and decoding texts with a trained `SeqVAE` (the class it is mixed into): its
    vocabulary reads the texts, evaluation mode and no autograd while they run."""

    def features(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Pooled encoder features h (N, H), the vectors `feature_cos` measures."""
        return scoring.features(self, texts, batch_size)

    def encode(self, texts: list[str], batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior parameters, mu first: (mu, logvar), each (N, Z), for the default Gaussian (`params()`)."""
        return scoring.encode(self, texts, batch_size)

    def elbo(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Negative ELBO per text in nats (one z sample), (N,)."""
        return scoring.elbo(self, texts, batch_size)

    def iw_nll(self, texts: list[str], n_samples: int = 500, batch_size: int = 16) -> torch.Tensor:
        """Importance-weighted NLL per text in nats, (N,); exact NLL for the language model."""
        return scoring.iw_nll(self, texts, n_samples, batch_size)

    def reconstruct(
        self,
        texts: list[str],
        temperature: float | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
        decoding: Decoding | None = None,
        beam_width: int | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Decodes each text from its posterior mean, as `seqvae predict` does: `decoding` "greedy" (default),
        "sample" (softmax(logits / temperature); the default when a temperature > 0 is given) or "beam"
        (width `beam_width`, default 5; the default when a width is given), up to the batch's longest
        input + 20 tokens. A setting the decoding would ignore is refused. `seed` fixes the sampling noise."""
        return generation.reconstruct(self, texts, temperature, max_length, batch_size, decoding, beam_width, seed)

    def interpolate(
        self,
        a: str,
        b: str,
        steps: int = 5,
        max_length: int | None = None,
        temperature: float | None = None,
        decoding: Decoding | None = None,
        beam_width: int | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """Decodes (as `reconstruct`; ≤ 100 tokens) `steps` points from a's posterior mean to b's, ends included."""
        return generation.interpolate(self, a, b, steps, max_length, temperature, decoding, beam_width, seed)

    def sample(
        self,
        n: int,
        temperature: float | None = None,
        max_length: int | None = None,
        decoding: Decoding | None = None,
        beam_width: int | None = None,
        seed: int | None = None,
    ) -> list[str]:
        """n texts decoded (as `reconstruct`; up to 100 tokens) from z ~ N(0, I), as
        `seqvae predict --model.generation.mode sample`. `seed` fixes z and the word noise."""
        return generation.sample(self, n, temperature, max_length, decoding, beam_width, seed)


__all__ = ["PythonAPI"]
