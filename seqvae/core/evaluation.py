"""What evaluation needs besides the metrics themselves: its own noise, and the size of an IW-NLL
decoder call.

Evaluation draws its noise (the z of rec, the IW-NLL samples, the per-batch MI's z) from its own
generators, seeded afresh at every evaluation pass from `model.eval_seed`: a checkpoint's metrics
do not depend on what ran before (fit's own test and a later `seqvae test` of the same checkpoint
agree). Each of the three has a generator of its own, so the number of importance samples changes
the IW-NLL alone: the same checkpoint tested with K = 100 and K = 500 has the same −ELBO and MI.
Under DDP a rank evaluates a contiguous part of the batches; it first draws, and throws away, the
noise of the batches before its part, so every batch gets the noise it gets in one process and
the reduced metrics equal the single-process ones.

AIS (`model.ais`, test only) draws from a stream of its own too, seeded afresh for each batch from
the eval seed and the batch's first text: no draws to skip under DDP, and a text's estimate does
not depend on what ran before its batch.
"""

from __future__ import annotations

import numpy as np
import torch

from seqvae.core import (
    dual_kl,  # noqa: F401 (declares DualKL, whose `test_batch` runs at test)
    elbo,
)
from seqvae.core.ais import exact_decoder_nll
from seqvae.core.chunking import iw_budget
from seqvae.core.metrics import iw_nll_from_weights, iw_nll_standard_error, posterior_iw_log_weights


def iw_chunk(tokens: torch.Tensor, vocab_size: int, budget: int | None) -> int:
    """Importance samples per decoder call so that its logits (B·chunk·T·V) stay within `budget`
    elements; None: `chunking.iw_budget` (2**26 on CPU, on a GPU a quarter of its free memory)."""
    per_sample = tokens.size(0) * tokens.size(1) * vocab_size
    if budget is None:  # per device (core/chunking.py); at the paper's size 2**26 alone would
        # decode one sample of 32 sentences per call: latency-bound on a GPU
        free = torch.cuda.mem_get_info(tokens.device)[0] if tokens.is_cuda else None
        budget = iw_budget(tokens.device.type, free)
    return max(1, budget // per_sample)


STREAMS = ("rec", "iw", "mi", "svi", "ais")  # appended only: an index is a stream's seed (svi: SA-VAE's refinement steps)


def stream_seed(seed: int, stream: str) -> int:
    """Seed of one noise stream of evaluation seed `seed`: independent streams (numpy's SeedSequence
    hashes the pair), so that no stream's draws are another's shifted."""
    return int(np.random.SeedSequence([seed, STREAMS.index(stream)]).generate_state(1, dtype=np.uint64)[0] >> 1)


class EvalNoise:
    """The generators of one evaluation pass (`rec`: the z of the reconstruction term, `iw`: the
    importance samples, `mi`: the per-batch MI's z), and (DDP) the batches whose noise this rank
    skips."""

    def __init__(self, seed: int, device: torch.device, latent_dim: int, preceding_sizes: list[int] = ()):
        self.rec, self.iw, self.mi, self.svi = (
            torch.Generator(device=device).manual_seed(stream_seed(seed, s)) for s in STREAMS[:4]
        )
        self.seed, self.device, self.latent_dim = seed, device, latent_dim
        self.svi_steps = 0  # draws of (B, Z) per batch from `svi` (`start`)
        self.pending = list(preceding_sizes)

    @classmethod
    def start(cls, module) -> EvalNoise:
        """For the evaluation pass `module`'s trainer is starting (validation or test)."""
        sizes = []
        if module._trainer is not None and module.trainer.world_size > 1:
            trainer = module.trainer
            loaders = trainer.test_dataloaders if trainer.testing else trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            sizes = list(getattr(getattr(loader, "batch_sampler", None), "preceding_sizes", []))
        noise = cls(module.hparams.eval_seed, module.device, module.hparams.latent_dim, sizes)
        noise.svi_steps = module.refine.steps if getattr(module, "refine", None) is not None else 0
        return noise

    def skip_preceding(self, dtype: torch.dtype, n_iw: int) -> None:
        """Draws, once, exactly what `evaluate_batch` draws for the batches before this rank's
        part: z for rec, the IW-NLL samples, the per-batch MI's z (float64)."""
        dim, device = self.latent_dim, self.device
        for b in self.pending:
            torch.randn((b, 1, dim), generator=self.rec, device=device, dtype=dtype)
            if n_iw:
                torch.randn((b, n_iw, dim), generator=self.iw, device=device, dtype=dtype)
            torch.randn((b, 1, dim), generator=self.mi, device=device, dtype=torch.float64)
            for _ in range(self.svi_steps):
                torch.randn((b, dim), generator=self.svi, device=device, dtype=dtype)
        self.pending = []

    def ais(self, index: torch.Tensor | None) -> torch.Generator:
        """The AIS generator of the batch whose first text (dataset position) is `index.min()`."""
        first = int(index.min()) if index is not None and index.numel() else 0
        state = np.random.SeedSequence([self.seed, STREAMS.index("ais"), first]).generate_state(1, dtype=np.uint64)[0]
        return torch.Generator(device=self.device).manual_seed(int(state >> 1))


def evaluate_batch(model, batch: dict, metrics, n_iw: int, ais=None) -> None:
    """One validation/test batch of `model` (a SeqVAE) into `metrics` (its EvalMetrics): rec and
    KL from one z, IW-NLL from `n_iw` importance samples, the posteriors for MI and AU, with `ais`
    (`core/ais.py`) the AIS estimate; for the language model the exact NLL. The noise comes from
    the pass's `EvalNoise` (`model._noise`)."""
    tokens, lengths, index = batch["tokens"], batch["lengths"], batch.get("index")
    n_predicted = lengths - 1
    if model.encoder is None:
        terms = elbo.elbo_terms(model.decoder, None, tokens, lengths)
        nll = terms.rec  # exact, and the KL 0
        iw, iw_se = (nll, torch.zeros_like(nll)) if n_iw else (None, None)
        estimate = exact_decoder_nll(nll) if ais is not None else None
        metrics.update(nll, terms.kl, n_predicted, iw_nll=iw, index=index, iw_se=iw_se, ais=estimate)
        return
    q, h = model.encoder.encode(tokens, lengths)
    noise = model._noise
    noise.skip_preceding(q.mean.dtype, n_iw)
    if getattr(model, "refine", None) is not None:  # SA-VAE: every metric at the refined posterior
        q = model.refine.evaluated(model, q, tokens, lengths, noise.svi)
    terms = elbo.elbo_terms(model.decoder, q, tokens, lengths, generator=noise.rec)
    iw = iw_se = None
    if n_iw:
        ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
        log_w = posterior_iw_log_weights(ll, q, n_iw, model.iw_chunk(tokens), noise.iw)  # (B, K)
        iw = iw_nll_from_weights(log_w)
        iw_se = iw_nll_standard_error(log_w)  # its Monte-Carlo noise, per text
    estimate = None
    if ais is not None:  # `ais_progress`: the hook a progress line may set on the model (`training/log_lines.py`)
        progress = getattr(model, "ais_progress", None)
        estimate = ais.estimate(model.decoder, tokens, lengths, q.mean.size(-1), noise.ais(index), progress)
    metrics.update(
        terms.rec,
        terms.kl,
        n_predicted,
        features=h,
        iw_nll=iw,
        mi_generator=noise.mi,
        index=index,
        iw_se=iw_se,
        posterior=q,
        ais=estimate,
    )
    if model._trainer is not None and model.trainer.testing:
        own = model.kl_penalty.test_batch(model, batch, q, h)  # a penalty's own estimates (DualKL: the reference's, SPEC §11.5)
        metrics.update_text_columns(own or {}, tokens.size(0))
