"""SeqVAE: the LSTM sequence VAE of Bowman et al. (2016) / He et al. (2019) as a LightningModule.

Read top to bottom: construction, the loss terms of one batch, the training step (manual
optimisation with an encoder and a decoder optimiser, as aggressive training needs), the
evaluation steps feeding `EvalMetrics`, checkpoint extras, and the Python API.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytorch_lightning as pl
import torch

from .aggressive import AggressiveTraining
from .data import BOS_ID, EOS_ID, PAD_ID, UNK_ID, ConfigError, Vocabulary, collate, load_checkpoint, run_seed
from .losses import KLPenalty, Regularizer, StandardKL, gaussian_kl
from .metrics import EvalMetrics, iw_log_weights, iw_nll, iw_nll_standard_error, sample_posterior
from .networks import Init, LSTMDecoder, LSTMEncoder, Pooling
from .schedules import KLSchedule, LinearKLWarmup

# Evaluation values are logged after EvalMetrics has reduced its states over all ranks: they
# are already the whole-set values on every rank, and Lightning's sync_dist would average them.
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting")

AGGRESSIVE_DDP = "model.aggressive: aggressive training is not supported under DDP (multi-process); train it on one device"


class NonFiniteError(FloatingPointError):
    """A loss term or the gradient became NaN/Inf; the message names the update and the term."""


Decoding = Literal["greedy", "sample", "beam"]


@dataclass(frozen=True)
class Generation:
    """What `seqvae predict` writes, one text per line (`--model.generation.mode …`).

    Args:
        mode: "reconstruct" decodes each input text (`data.predict`, default the test split)
            from its posterior mean; "sample" decodes `n` texts from z ~ N(0, I) (the inputs are
            not read); "interpolate" reads the inputs as pairs (lines 1-2, 3-4, …) and decodes
            `steps` points on the straight line between each pair's posterior means, both ends
            included (`steps` lines per pair).
        decoding: "greedy" (the most probable word at each step), "sample" (from
            softmax(logits / temperature)) or "beam" (beam search, `LSTMDecoder.beam_search`).
        temperature: Softmax temperature of decoding "sample".
        beam_width: Hypotheses kept by decoding "beam" (1 is greedy).
        n: Texts drawn in mode "sample".
        steps: Points per pair in mode "interpolate".
        max_length: Most tokens decoded per text (`</s>` included); default: the batch's longest
            input + 20 in mode "reconstruct", 100 otherwise.
        seed: Seed of every random draw of generation (prior z, sampled words): the same seed
            gives the same texts.
        stdout: Also print the texts to stdout (predictions.txt is always written).
    """

    mode: Literal["reconstruct", "sample", "interpolate"] = "reconstruct"
    decoding: Decoding = "greedy"
    temperature: float = 1.0
    beam_width: int = 5
    n: int = 10
    steps: int = 5
    max_length: int | None = None
    seed: int = 0
    stdout: bool = False


def _numpy_state() -> tuple:
    """numpy's global RNG state as plain Python values (checkpoints load with weights_only)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return name, keys.tolist(), int(pos), int(has_gauss), float(cached)


class SeqVAE(pl.LightningModule):
    """LSTM encoder → Gaussian q(z|x) → LSTM decoder p(x|z), trained on rec + w·KL.

    Args:
        vocab_size: Vocabulary size (linked from `data.vocab_size` by the CLI).
        embed_dim: Word embedding size of encoder and decoder (512 in the paper).
        hidden_dim: LSTM size of encoder and decoder (1024 in the paper).
        latent_dim: Size of z (32 in the paper). 0 gives the LSTM language model baseline.
        pooling: Encoder feature: "last" hidden state (reference), or "avg"/"max"/"abs" over time.
        dropout_in: Dropout on decoder input embeddings.
        dropout_out: Dropout on decoder LSTM outputs.
        word_dropout: Probability of replacing each decoder input word after `<s>` by unk (Bowman).
        skip: SkipVAE (Dieng et al. 2019): z also enters the decoder's output layer.
        kl_schedule: KL weight per update (default: linear warm-up from 0.1 over 10 epochs).
        kl_penalty: The KL term in the training loss (default: the true KL; or free bits).
        regularizers: Extra loss terms on encoder features, e.g. CosineDispersion.
        lr: SGD learning rate of both optimisers (1.0 in He et al.).
        grad_clip: Clip the norm of the whole gradient (all parameters together) at this value.
        val_iw_samples: Importance samples for IW-NLL during validation (0: off).
        test_iw_samples: Importance samples for IW-NLL at test (500 in the papers).
        iw_max_elements: Memory budget of one IW decoder chunk, in logits (B·K·T·V) elements;
            None: 2**26 on CPU, and on a GPU a sixteenth of its free memory in fp32 elements.
        mi_dataset: Also compute MI with the whole evaluation set as the pool (Li et al.).
        eval_seed: Seed of the noise of every evaluation pass (z samples of rec, IW-NLL and MI).
        init_encoder_from: Checkpoint whose encoder (embedding, LSTM, posterior layer) replaces
            this model's before training (encoder pretraining); the decoder stays fresh.
        aggressive: Aggressive encoder training (He et al. 2019); None for plain training.
        bn_gamma: BN-VAE (Zhu et al. 2020): batch-normalise the posterior means with this fixed
            scale γ (learned shift), which keeps E[KL] ≥ Z·γ²/2; None to turn off.
        bn_eps: BatchNorm's ε for BN-VAE. The bound needs the batch variance of the raw means
            ≫ ε; the default 1e-5 is PyTorch's and Zhu et al.'s.
        init: Weight initialisation of both networks: "reference" (He et al.: U(-0.01, 0.01))
            or "pytorch" (PyTorch's fan-in defaults for LSTM and Linear layers); embeddings are
            U(-0.1, 0.1) in both. See `networks.init_weights` for why the choice matters.
        generation: What `seqvae predict` writes (see `Generation`); a predict-time setting, not
            saved with the hyper-parameters.
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 512,
        hidden_dim: int = 1024,
        latent_dim: int = 32,
        pooling: Pooling = "last",
        dropout_in: float = 0.5,
        dropout_out: float = 0.5,
        word_dropout: float = 0.0,
        skip: bool = False,
        kl_schedule: KLSchedule | None = None,
        kl_penalty: KLPenalty | None = None,
        regularizers: list[Regularizer] | None = None,
        lr: float = 1.0,
        grad_clip: float = 5.0,
        val_iw_samples: int = 0,
        test_iw_samples: int = 500,
        iw_max_elements: int | None = None,
        mi_dataset: bool = True,
        eval_seed: int = 0,
        init_encoder_from: str | None = None,
        aggressive: AggressiveTraining | None = None,
        bn_gamma: float | None = None,
        bn_eps: float = 1e-5,
        init: Init = "reference",
        generation: Generation = Generation(),  # noqa: B008 (frozen: immutable default)
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["generation"])
        self.generation = generation
        self.automatic_optimization = False  # two optimisers; aggressive training steps them apart
        self.kl_schedule = kl_schedule or LinearKLWarmup()
        self.kl_penalty = kl_penalty or StandardKL()
        self.regularizers = list(regularizers or [])
        self.aggressive = aggressive
        self.encoder = None
        if latent_dim:
            self.encoder = LSTMEncoder(vocab_size, embed_dim, hidden_dim, latent_dim, pooling, bn_gamma, bn_eps, init)
        self.decoder = LSTMDecoder(vocab_size, embed_dim, hidden_dim, latent_dim, dropout_in, dropout_out, skip, init)
        self.val_metrics = EvalMetrics(latent_dim, hidden_dim, mi_dataset)
        self.test_metrics = EvalMetrics(latent_dim, hidden_dim, mi_dataset, per_text=True)  # per_text.csv
        self.num_updates = 0  # training batches consumed (outer iterations); drives the KL schedule
        self.encoder_updates = 0  # optimiser steps of the encoder (> num_updates when aggressive)
        self.decoder_updates = 0
        self.fit_seconds = 0.0  # training wall time, accumulated across resumes
        self.vocab: Vocabulary | None = None
        self._eval_generator: torch.Generator | None = None
        self._eval_replay: list[int] = []  # DDP: batch sizes whose evaluation noise this rank skips
        self._resume_rng: dict | None = None  # RNG states of a mid-epoch checkpoint, until training resumes
        self._batch_idx = 0
        self.last_test_rows: dict[str, torch.Tensor] | None = None

    # ---------------------------------------------------------------- loss of one batch
    def kl_weight(self) -> float:
        return self.kl_schedule.weight(
            self.num_updates, max(1, int(self.trainer.num_training_batches)), self.trainer.max_epochs or 1
        )

    def decoder_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs = tokens[:, :-1]
        p = self.hparams.word_dropout
        if p > 0 and self.training:
            drop = torch.rand(inputs.shape, device=inputs.device) < p
            drop[:, 0] = False  # `<s>` is kept
            inputs = inputs.masked_fill(drop & (inputs != PAD_ID), UNK_ID)
        return inputs

    def loss_terms(self, batch: dict[str, torch.Tensor], kl_weight: float) -> dict[str, torch.Tensor]:
        """Training loss (mean over sentences) and its parts, one z sample per sentence."""
        tokens, lengths = batch["tokens"], batch["lengths"]
        inputs = self.decoder_inputs(tokens)
        if self.encoder is None:  # language model
            rec = -self.decoder.log_likelihood(tokens, lengths, None, inputs)[:, 0]
            return {"loss": rec.mean(), "rec": rec.mean().detach()}
        mu, logvar, h = self.encoder(tokens, lengths)
        z = sample_posterior(mu, logvar, 1)  # (B, 1, Z)
        rec = -self.decoder.log_likelihood(tokens, lengths, z, inputs)[:, 0]  # (B,)
        kl_dims = gaussian_kl(mu, logvar)  # (B, Z)
        loss = (rec + kl_weight * self.kl_penalty(kl_dims)).mean()
        terms = {"rec": rec.mean().detach(), "kl": kl_dims.sum(-1).mean().detach()}
        for reg in self.regularizers:
            value = reg(h)
            loss = loss + value
            terms[reg.name] = value.detach()
        terms["loss"] = loss
        return terms

    # ---------------------------------------------------------------- training
    def configure_optimizers(self):
        groups = [m for m in (self.encoder, self.decoder) if m is not None]
        return [torch.optim.SGD(m.parameters(), lr=self.hparams.lr) for m in groups]

    def _optimizers(self) -> list:
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def update_step(self, batch, kl_weight: float, stepped: torch.nn.Module | None = None, clip_joint: bool = False) -> dict:
        """One SGD update on `batch`: of the whole model, or of `stepped` only (the other
        module's weights then get no gradients at all; gradients still flow through them).
        `clip_joint` (the reference's aggressive steps): the other module's gradients are computed
        too, the norm of ALL gradients is clipped, and only `stepped` is updated."""
        opts = self._optimizers()
        others = [
            p
            for m in (self.encoder, self.decoder)
            if m is not None and stepped is not None and m is not stepped
            for p in m.parameters()
        ]
        # Only parameters that train are frozen and unfrozen again: one frozen on purpose
        # (BN-VAE's fixed γ) stays frozen after the step.
        frozen = [] if clip_joint else [p for p in others if p.requires_grad]
        for p in frozen:
            p.requires_grad_(False)
        try:
            terms = self.loss_terms(batch, kl_weight)
            for opt in opts:
                opt.zero_grad()
            self.manual_backward(terms["loss"])
        finally:
            for p in frozen:
                p.requires_grad_(True)
        # The norm of all gradients of what is stepped is clipped together, not per optimiser.
        clipped = self if stepped is None or clip_joint else stepped
        params = [p for p in clipped.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.hparams.grad_clip)
        self._check_finite(terms, grad_norm)
        for p in others:  # clip_joint: computed for the norm only; SGD skips a None grad
            p.grad = None
        for opt in opts:
            opt.step()  # SGD skips parameters whose grad is None
        return {k: v.detach() for k, v in terms.items()}

    def _check_finite(self, terms: dict, grad_norm: torch.Tensor) -> None:
        """Stops before a non-finite update reaches the weights (one host sync per update)."""
        values = torch.stack([v.detach().float() for v in terms.values()] + [grad_norm.float()])
        finite = bool(torch.isfinite(values).all())
        if self._trainer is not None and self.trainer.world_size > 1:
            # Every rank stops together (one that raised alone would leave the others waiting).
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if finite:
            return
        bad = [k for k, v in zip([*terms, "grad_norm"], values.tolist()) if not math.isfinite(v)] or ["values on another rank"]
        raise NonFiniteError(
            f"non-finite {', '.join(bad)} at update {self.num_updates + 1} "
            f"(epoch {self.trainer.current_epoch}, batch index {self._batch_idx}); "
            "weights not updated, the last checkpoint is kept"
        )

    def training_step(self, batch, batch_idx):
        self._batch_idx = batch_idx
        weight = self.kl_weight()
        if self.aggressive is not None and self.aggressive.active and self.encoder is not None:
            inner_steps = self.aggressive.train_encoder(self, batch, weight)
            terms = self.update_step(batch, weight, stepped=self.decoder, clip_joint=self.aggressive.clip == "joint")
            self.encoder_updates += inner_steps
            self.log("train/inner_steps", float(inner_steps))
        else:
            terms = self.update_step(batch, weight)
            self.encoder_updates += self.encoder is not None
        self.decoder_updates += 1
        self.num_updates += 1
        self.log_dict({f"train/{k}": v for k, v in terms.items()}, batch_size=batch["tokens"].size(0))
        self.log("train/kl_weight", weight)
        self.log_dict(
            {"train/encoder_updates": float(self.encoder_updates), "train/decoder_updates": float(self.decoder_updates)}
        )

    def on_train_epoch_start(self):
        # Dropout, word dropout and z noise draw from the global RNGs. Reseeding them from
        # (run seed, epoch) makes each epoch's noise independent of what ran before it
        # (sanity checks, validation, an interruption): a run resumed at an epoch boundary ends
        # with exactly the parameters of an uninterrupted one.
        seed = run_seed() * 1_000_003 + self.current_epoch
        torch.manual_seed(seed)
        random.seed(seed)

    def on_train_batch_start(self, batch, batch_idx):
        # A run resumed from a mid-epoch checkpoint (no on_train_epoch_start then) continues with
        # the RNG states the interrupted run had after the checkpoint's batch: set just before
        # the first training step, whatever ran since the load (sanity checks) drew.
        state, self._resume_rng = self._resume_rng, None
        if state is not None and state["epoch"] == self.current_epoch:
            torch.set_rng_state(state["torch"])
            random.setstate(state["random"])
            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
            if isinstance(state.get("cuda"), torch.Tensor) and self.device.type == "cuda":
                torch.cuda.set_rng_state(state["cuda"], self.device)

    def on_train_start(self):
        self._fit_clock = time.monotonic()
        if self.vocab is None and self.trainer.datamodule is not None:
            self.vocab = self.trainer.datamodule.vocab

    def _tick(self):
        if getattr(self, "_fit_clock", None) is not None:
            now = time.monotonic()
            self.fit_seconds += now - self._fit_clock
            self._fit_clock = now

    def on_train_end(self):
        self._tick()
        self._fit_clock = None

    def setup(self, stage: str):
        dm = self.trainer.datamodule if self._trainer is not None else None
        if dm is not None and self.vocab is None:
            self.vocab = dm.vocab
        if stage == "fit" and self.aggressive is not None and self._trainer is not None and self.trainer.world_size > 1:
            # Its inner loop runs a data-dependent number of encoder updates per batch, which the
            # ranks' gradient all-reduces cannot follow. Refused rather than hung.
            raise ConfigError(AGGRESSIVE_DDP)
        if stage == "fit" and self.hparams.init_encoder_from and self.encoder is not None:
            # Runs before Lightning restores a resumed run's own checkpoint, which then
            # overwrites these weights: resuming never re-initialises anything.
            state = load_checkpoint(self.hparams.init_encoder_from, "model.init_encoder_from")["state_dict"]
            encoder_state = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
            self.encoder.load_state_dict(encoder_state)

    # ---------------------------------------------------------------- evaluation
    def _iw_chunk(self, tokens: torch.Tensor) -> int:
        per_sample = tokens.size(0) * tokens.size(1) * self.hparams.vocab_size
        budget = self.hparams.iw_max_elements
        if budget is None:
            budget = 2**26
            if tokens.is_cuda:
                # The logits, cross-entropy's log-softmax copy and temporaries: ~4 fp32 copies,
                # kept within a quarter of the free memory. (At the paper's size, 2**26 alone
                # would decode one sample of 32 sentences per call: latency-bound on a GPU.)
                budget = max(budget, torch.cuda.mem_get_info(tokens.device)[0] // 64)
        return max(1, budget // per_sample)

    def _eval_step(self, batch, metrics: EvalMetrics, n_iw: int) -> None:
        tokens, lengths = batch["tokens"], batch["lengths"]
        n_predicted = lengths - 1
        index = batch.get("index")
        if self.encoder is None:
            nll = -self.decoder.log_likelihood(tokens, lengths, None)[:, 0]  # exact
            iw, iw_se = (nll, torch.zeros_like(nll)) if n_iw else (None, None)
            metrics.update(nll, torch.zeros_like(nll), n_predicted, iw_nll=iw, index=index, iw_se=iw_se)
            return
        gen = self._eval_generator
        mu, logvar, h = self.encoder(tokens, lengths)
        if self._eval_replay:
            self._replay_eval_noise(self._eval_replay, mu.dtype, n_iw)
            self._eval_replay = []
        rec = -self.decoder.log_likelihood(tokens, lengths, sample_posterior(mu, logvar, 1, gen))[:, 0]
        kl = gaussian_kl(mu, logvar).sum(-1)
        iw = iw_se = None
        if n_iw:
            ll = lambda z: self.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
            log_w = iw_log_weights(ll, mu, logvar, n_iw, self._iw_chunk(tokens), gen)  # (B, K)
            iw = -(torch.logsumexp(log_w, dim=1) - math.log(n_iw))
            iw_se = iw_nll_standard_error(log_w)  # its Monte-Carlo noise, per text
        metrics.update(rec, kl, n_predicted, mu, logvar, h, iw, mi_generator=gen, index=index, iw_se=iw_se)

    def _start_eval(self):
        # Evaluation draws its noise from its own generator, seeded afresh every epoch: a
        # checkpoint's metrics do not depend on what ran before (fit's own test and a later
        # `seqvae test` of the same checkpoint agree).
        self._eval_generator = torch.Generator(device=self.device).manual_seed(self.hparams.eval_seed)
        # Under DDP a rank evaluates a contiguous part of the batches; it first skips the noise
        # of the batches before its part, so every batch gets the noise it gets in one process.
        self._eval_replay = []
        if self._trainer is not None and self.trainer.world_size > 1:
            loaders = self.trainer.test_dataloaders if self.trainer.testing else self.trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
            self._eval_replay = list(getattr(getattr(loader, "batch_sampler", None), "preceding_sizes", []))

    def _replay_eval_noise(self, sizes: list[int], dtype: torch.dtype, n_iw: int) -> None:
        """Draws from the evaluation generator exactly what `_eval_step` draws for batches of
        these sizes, in its order: z for rec, the IW-NLL samples, the per-batch MI's z (float64)."""
        gen, dim, device = self._eval_generator, self.hparams.latent_dim, self.device
        for b in sizes:
            torch.randn((b, 1, dim), generator=gen, device=device, dtype=dtype)
            if n_iw:
                torch.randn((b, n_iw, dim), generator=gen, device=device, dtype=dtype)
            torch.randn((b, 1, dim), generator=gen, device=device, dtype=torch.float64)

    def _log_eval(self, stage: str, metrics: EvalMetrics) -> dict[str, float]:
        values = {f"{stage}/{k}": v for k, v in metrics.compute().items()}
        metrics.reset()
        self.log_dict(values)
        return values

    def on_validation_epoch_start(self):
        self._start_eval()

    def on_test_epoch_start(self):
        self._start_eval()

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, self.val_metrics, self.hparams.val_iw_samples)

    def on_validation_epoch_end(self):
        values = self._log_eval("val", self.val_metrics)
        if not self.trainer.sanity_checking and self.trainer.state.fn == "fit":
            if self.aggressive is not None and self.aggressive.active:
                self.aggressive.end_epoch(float(values["val/mi"]))
            self.log("train/aggressive", float(self.aggressive is not None and self.aggressive.active))
            self._tick()
            self.log("train/lr", self._optimizers()[0].param_groups[0]["lr"])
            self.log("train/wall_seconds", self.fit_seconds)

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, self.test_metrics, self.hparams.test_iw_samples)

    def on_test_epoch_end(self):
        # Per-text values (gathered over DDP ranks), for the CLI's per_text.csv.
        self.last_test_rows = {k: v.cpu() for k, v in self.test_metrics.per_text_rows().items()}
        self._log_eval("test", self.test_metrics)

    def on_predict_start(self):
        g = self.generation
        if g.mode == "interpolate":
            if self.encoder is None:
                raise ConfigError("model.generation.mode: the language model has no latent space to interpolate in")
            loaders = self.trainer.predict_dataloaders
            n_texts = sum(len(dl.dataset) for dl in (loaders if isinstance(loaders, (list, tuple)) else [loaders]))
            if n_texts % 2:
                raise ConfigError(f"model.generation.mode interpolate reads pairs of lines; the predict texts have {n_texts}")
        self._check_decoding(g.decoding, g.temperature, g.beam_width)
        # All generation noise (prior z, sampled words) comes from this generator: one seed, one output.
        self._predict_generator = torch.Generator(device=self.device).manual_seed(g.seed)
        self._pending_mu = None  # interpolation: the first text of a pair split across batches

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        """`seqvae predict`: the texts of `self.generation` for this batch of inputs, in input
        order (a collapsed model gives the same text for every input, visibly)."""
        g, gen = self.generation, self._predict_generator
        tokens, lengths = batch["tokens"], batch["lengths"]
        if g.mode == "sample":
            if batch_idx or dataloader_idx:
                return []
            return self._sample(g.n, g.max_length or 100, g.decoding, g.temperature, g.beam_width, gen)
        z = self.encoder(tokens, lengths)[0] if self.encoder is not None else None
        if g.mode == "interpolate":
            if self._pending_mu is not None:
                z, self._pending_mu = torch.cat([self._pending_mu, z]), None
            if z.size(0) % 2:
                z, self._pending_mu = z[:-1], z[-1:]
            if not z.size(0):
                return []
            z = torch.cat([_line(a, b, g.steps) for a, b in zip(z[0::2], z[1::2])])
        n = tokens.size(0) if z is None else z.size(0)
        max_length = g.max_length or (int(lengths.max()) + 20 if g.mode == "reconstruct" else 100)
        return self._decode(z, n, max_length, g.decoding, g.temperature, g.beam_width, gen)

    # ---------------------------------------------------------------- checkpoint extras
    def on_save_checkpoint(self, checkpoint):
        self._tick()
        checkpoint["seqvae"] = {
            "num_updates": self.num_updates,
            "encoder_updates": self.encoder_updates,
            "decoder_updates": self.decoder_updates,
            "fit_seconds": self.fit_seconds,
        }
        if self.aggressive is not None:
            checkpoint["seqvae"]["aggressive"] = self.aggressive.state_dict()
        if self._trainer is not None and self.trainer.state.fn == "fit":
            # A checkpoint written during fit (mid-epoch, or at a validation inside the epoch
            # with val_check_interval < 1: evaluation draws only from its own generator) carries
            # the RNG states that the next training batch would start from, for an exact resume;
            # they are restored only if the run resumes inside the same epoch. (The evaluation
            # generator is reseeded at every evaluation pass; the aggressive-training RNG is in
            # its state above.)
            rng = {
                "epoch": self.current_epoch,
                "torch": torch.get_rng_state(),
                "random": random.getstate(),
                "numpy": _numpy_state(),
                # This rank's device only: a resume may see a different number of GPUs.
                "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            }
            if self.trainer.world_size > 1:  # every rank's own states (their batches differ)
                states = [None] * self.trainer.world_size
                torch.distributed.all_gather_object(states, rng)
                rng = {"epoch": rng["epoch"], "ranks": states}
            checkpoint["seqvae"]["rng"] = rng
        if self.vocab is not None:
            checkpoint["vocab"] = self.vocab.to_str()

    def on_load_checkpoint(self, checkpoint):
        extra = checkpoint.get("seqvae", {})
        self.num_updates = extra.get("num_updates", 0)
        self.fit_seconds = extra.get("fit_seconds", 0.0)
        self.encoder_updates = extra.get("encoder_updates", 0)
        self.decoder_updates = extra.get("decoder_updates", 0)
        if self.aggressive is not None and "aggressive" in extra:
            self.aggressive.load_state_dict(extra["aggressive"])
        rng = extra.get("rng")
        if rng is not None and "ranks" in rng:
            rank, world = (self.trainer.global_rank, self.trainer.world_size) if self._trainer is not None else (0, 1)
            rng = rng["ranks"][rank] if world == len(rng["ranks"]) else None  # another world size: not exact anyway
        self._resume_rng = rng
        if "vocab" in checkpoint:
            self.vocab = Vocabulary.from_str(checkpoint["vocab"])

    # ---------------------------------------------------------------- Python API
    def _batches(self, texts: list[str], batch_size: int):
        if self.vocab is None:
            raise RuntimeError("this model has no vocabulary: load it from a checkpoint or train it first")
        ids = self.vocab.encode([t.split() for t in texts])
        for s in range(0, len(ids), batch_size):
            batch = collate([torch.tensor(x) for x in ids[s : s + batch_size]])
            yield {k: v.to(self.device) for k, v in batch.items()}

    @contextlib.contextmanager
    def _inference(self):
        """Eval mode (no dropout) and no autograd, restoring the previous mode afterwards."""
        was_training = self.training
        self.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.train(was_training)

    def _evaluate(self, texts: list[str], per_batch, batch_size: int):
        with self._inference():
            return [per_batch(b) for b in self._batches(list(texts), batch_size)]

    def features(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Pooled encoder features h (N, H), the vectors `feature_cos` measures."""
        if self.encoder is None:
            raise RuntimeError("the language model has no encoder")
        outs = self._evaluate(texts, lambda b: self.encoder.features(b["tokens"], b["lengths"]), batch_size)
        return torch.cat(outs) if outs else torch.empty(0, self.hparams.hidden_dim)

    def encode(self, texts: list[str], batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior parameters (mu, logvar), each (N, Z), for whitespace-tokenised texts."""
        outs = self._evaluate(texts, lambda b: self.encoder(b["tokens"], b["lengths"])[:2], batch_size)
        z = self.hparams.latent_dim
        if not outs:
            return torch.empty(0, z), torch.empty(0, z)
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    def elbo(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Negative ELBO per text in nats (one z sample), (N,)."""

        def per_batch(b):
            tokens, lengths = b["tokens"], b["lengths"]
            if self.encoder is None:
                return -self.decoder.log_likelihood(tokens, lengths, None)[:, 0]
            mu, logvar, _ = self.encoder(tokens, lengths)
            rec = -self.decoder.log_likelihood(tokens, lengths, sample_posterior(mu, logvar, 1))[:, 0]
            return rec + gaussian_kl(mu, logvar).sum(-1)

        outs = self._evaluate(texts, per_batch, batch_size)
        return torch.cat(outs) if outs else torch.empty(0)

    @staticmethod
    def _check_decoding(decoding: str, temperature: float, beam_width: int) -> None:
        if decoding not in ("greedy", "sample", "beam"):
            raise ConfigError(f"decoding must be greedy, sample or beam, got {decoding!r}")
        if decoding == "sample" and not temperature > 0:
            raise ConfigError(f"decoding 'sample' needs a temperature > 0, got {temperature}")
        if decoding == "beam" and beam_width < 1:
            raise ConfigError(f"decoding 'beam' needs beam_width ≥ 1, got {beam_width}")

    def _decode(self, z, n: int, max_length: int, decoding: str, temperature: float, beam_width: int, generator=None):
        """Texts decoded from z (n, Z) (None: the language model) by greedy, sampling or beam search."""
        if decoding == "beam":
            ids = self.decoder.beam_search(z, n, BOS_ID, EOS_ID, max_length, beam_width)[0]
        else:
            t = temperature if decoding == "sample" else 0.0
            ids = self.decoder.generate(z, n, BOS_ID, EOS_ID, max_length, t, generator)
        return [self.vocab.decode(row.tolist()) for row in ids]

    def _sample(self, n: int, max_length: int, decoding: str, temperature: float, beam_width: int, generator=None):
        z = None
        if self.encoder is not None:
            z = torch.randn(n, self.hparams.latent_dim, device=self.device, generator=generator)
        return self._decode(z, n, max_length, decoding, temperature, beam_width, generator)

    @staticmethod
    def _decoding(decoding: str | None, temperature: float) -> str:
        return decoding or ("sample" if temperature > 0 else "greedy")

    def _api_generator(self, seed: int | None):
        return None if seed is None else torch.Generator(device=self.device).manual_seed(seed)

    def reconstruct(
        self,
        texts: list[str],
        temperature: float = 0.0,
        max_length: int = 100,
        batch_size: int = 64,
        decoding: Decoding | None = None,
        beam_width: int = 5,
        seed: int | None = None,
    ) -> list[str]:
        """Decodes each text from its posterior mean: `decoding` "greedy", "sample" (from
        softmax(logits / temperature)) or "beam" (width `beam_width`); by default greedy when
        temperature is 0, else sampled. `seed` fixes the sampling noise (default: the global RNG)."""
        decoding = self._decoding(decoding, temperature)
        self._check_decoding(decoding, temperature, beam_width)
        gen = self._api_generator(seed)

        def per_batch(b):
            z = self.encoder(b["tokens"], b["lengths"])[0] if self.encoder is not None else None
            return self._decode(z, b["tokens"].size(0), max_length, decoding, temperature, beam_width, gen)

        return [t for out in self._evaluate(texts, per_batch, batch_size) for t in out]

    def interpolate(
        self,
        a: str,
        b: str,
        steps: int = 5,
        max_length: int = 100,
        temperature: float = 0.0,
        decoding: Decoding | None = None,
        beam_width: int = 5,
        seed: int | None = None,
    ) -> list[str]:
        """Decodes (greedy by default; `decoding` as in `reconstruct`) the `steps` points on the
        straight line between the posterior means of texts a and b, both ends included."""
        if self.encoder is None:
            raise RuntimeError("the language model has no latent space to interpolate in")
        decoding = self._decoding(decoding, temperature)
        self._check_decoding(decoding, temperature, beam_width)
        mu, _ = self.encode([a, b])
        with self._inference():
            z = _line(mu[0], mu[1], steps)
            return self._decode(z, steps, max_length, decoding, temperature, beam_width, self._api_generator(seed))

    def sample(
        self,
        n: int,
        temperature: float = 1.0,
        max_length: int = 100,
        decoding: Decoding | None = None,
        beam_width: int = 5,
        seed: int | None = None,
    ) -> list[str]:
        """n texts decoded from z ~ N(0, I): sampled words by default (greedy when temperature
        is 0; `decoding` as in `reconstruct`). `seed` fixes z and the word noise."""
        if self.vocab is None:
            raise RuntimeError("this model has no vocabulary: load it from a checkpoint or train it first")
        decoding = self._decoding(decoding, temperature)
        self._check_decoding(decoding, temperature, beam_width)
        with self._inference():
            return self._sample(n, max_length, decoding, temperature, beam_width, self._api_generator(seed))

    def iw_nll(self, texts: list[str], n_samples: int = 500, batch_size: int = 16) -> torch.Tensor:
        """Importance-weighted NLL per text in nats, (N,); exact NLL for the language model."""

        def per_batch(b):
            tokens, lengths = b["tokens"], b["lengths"]
            if self.encoder is None:
                return -self.decoder.log_likelihood(tokens, lengths, None)[:, 0]
            mu, logvar, _ = self.encoder(tokens, lengths)
            return iw_nll(
                lambda z: self.decoder.log_likelihood(tokens, lengths, z), mu, logvar, n_samples, self._iw_chunk(tokens)
            )

        outs = self._evaluate(texts, per_batch, batch_size)
        return torch.cat(outs) if outs else torch.empty(0)


def _line(a: torch.Tensor, b: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` evenly spaced points from a to b (Z,), both included: (steps, Z)."""
    weights = torch.linspace(0, 1, steps, device=a.device, dtype=a.dtype).unsqueeze(1)
    return (1 - weights) * a + weights * b
