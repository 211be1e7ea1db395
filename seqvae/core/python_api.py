"""The Python API of a trained model: the methods `SeqVAE` inherits for scoring texts (`scoring.py`)
and decoding them (`generation.py`), thin calls into those modules; see docs/python-api.md.
"""

from __future__ import annotations

import torch

from seqvae.core import generation, scoring
from seqvae.core.generation import Decoding
from seqvae.errors import ConfigError
from seqvae.store.checkpoints import load_checkpoint, require_run_checkpoint


def checked_texts(texts, name: str = "texts") -> list:
    """The texts as a list, each a string (or a list of words): one string was iterated letter by
    letter (`model.elbo("a text")` scored each character as a text), other values failed deep inside."""
    if isinstance(texts, (str, bytes)):
        raise ConfigError(f"{name}: expected a list of texts, got one {type(texts).__name__}: wrap it, [text]")
    try:
        texts = list(texts)
    except TypeError:
        raise ConfigError(f"{name}: expected a list of texts (strings), got {type(texts).__name__}") from None
    for i, t in enumerate(texts):
        if not isinstance(t, str) and not (isinstance(t, (list, tuple)) and all(isinstance(w, str) for w in t)):
            raise ConfigError(f"{name}[{i}]: expected a string (or a list of words), got {type(t).__name__} {t!r}")
    return texts


def at_least(name: str, value, low: int = 1) -> None:
    """A count the call needs (`n`, `steps`, `max_length`, `n_samples`, `batch_size`): an integer >= low,
    as `seqvae predict` refuses it (0 gave an empty result or the default, a negative a torch error)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
        raise ConfigError(f"{name}: must be an integer >= {low}, got {value!r}")


class PythonAPI:
    """Scoring and decoding texts with a trained `SeqVAE` (the class it is mixed into): its
    vocabulary reads the texts, evaluation mode and no autograd while they run."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, *args, **kwargs):
        """Lightning's, after the file is read as `seqvae test --ckpt_path` reads it: a missing file,
        one that is not a checkpoint of `seqvae fit` or one carrying code is one line (ValueError),
        not torch's traceback or its advice to load with weights_only=False."""
        require_run_checkpoint(load_checkpoint(checkpoint_path, "checkpoint_path"), checkpoint_path, "checkpoint_path")
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def features(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Pooled encoder features h (N, H), the vectors `feature_cos` measures."""
        at_least("batch_size", batch_size)
        return scoring.features(self, checked_texts(texts), batch_size)

    def encode(self, texts: list[str], batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior parameters, mu first (`params()`): (mu, logvar), each (N, Z), for the default
        Gaussian; (mu (N, Z), L (Z, Z)) for FullCovGaussianPosterior, whose L every text shares."""
        at_least("batch_size", batch_size)
        return scoring.encode(self, checked_texts(texts), batch_size)

    def elbo(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Negative ELBO per text in nats (one z sample), (N,)."""
        at_least("batch_size", batch_size)
        return scoring.elbo(self, checked_texts(texts), batch_size)

    def iw_nll(self, texts: list[str], n_samples: int = 500, batch_size: int = 16) -> torch.Tensor:
        """Importance-weighted NLL per text in nats, (N,); exact NLL for the language model."""
        at_least("n_samples", n_samples)
        at_least("batch_size", batch_size)
        return scoring.iw_nll(self, checked_texts(texts), n_samples, batch_size)

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
        at_least("max_length", max_length)
        at_least("batch_size", batch_size)
        texts = checked_texts(texts)
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
        a, b = checked_texts([a, b], "a, b")
        at_least("steps", steps, 2)  # both ends
        at_least("max_length", max_length)
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
        at_least("n", n)
        at_least("max_length", max_length)
        return generation.sample(self, n, temperature, max_length, decoding, beam_width, seed)


__all__ = ["PythonAPI"]
