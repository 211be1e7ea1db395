"""SeqVAE: the LSTM sequence VAE of Bowman et al. (2016) / He et al. (2019) as a LightningModule.

Read top to bottom: construction, the loss terms of one batch, the training step (manual
optimisation with an encoder and a decoder optimiser, as aggressive training needs), the
evaluation step feeding `EvalMetrics` and the model's own checkpoint state; the Python API
(scoring and decoding texts) is inherited from `python_api.PythonAPI`. Exact resume (RNG states,
per-epoch reseeding) is the `ExactResume` callback the model brings along.
"""

from __future__ import annotations

import math
import warnings

import pytorch_lightning as pl
import torch

from seqvae.core import chunking, planar_flow  # noqa: F401  (planar_flow declares `class_path: seqvae.PlanarFlowPosterior`)
from seqvae.core.aggressive import AggressiveTraining
from seqvae.core.ais import AIS
from seqvae.core.bn_bound import BNBoundCheck
from seqvae.core.evaluation import EvalNoise, evaluate_batch, iw_chunk
from seqvae.core.generation import Generation, Predictor
from seqvae.core.isobn import IsoBN
from seqvae.core.losses import KLPenalty, Regularizer, StandardKL
from seqvae.core.metrics import EvalMetrics
from seqvae.core.networks import Init, LSTMDecoder, Pooling, make_encoder, pretrained_encoder, vae_optimizers
from seqvae.core.optimizers import Optimizer
from seqvae.core.posteriors import Posterior
from seqvae.core.python_api import PythonAPI
from seqvae.core.refinement import SVIRefinement
from seqvae.core.schedules import KLSchedule, LinearKLWarmup
from seqvae.core.transformer import TransformerEncoder
from seqvae.errors import ConfigError
from seqvae.options import MODEL_OPTIONS, check_option, check_strategy
from seqvae.text.corpus import PAD_ID, UNK_ID, Vocabulary
from seqvae.training.callbacks import EvalMemory, ExactResume, FitClock
from seqvae.training.host_reads import DeferredFiniteCheck, logging_now
from seqvae.training.log_lines import EpochMean

from . import elbo

__all__ = ["Generation", "NonFiniteError", "SeqVAE"]

# Evaluation values are logged after EvalMetrics has reduced its states over all ranks: they
# are already the whole-set values on every rank, and Lightning's sync_dist would average them.
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting")

AGGRESSIVE_DDP = "model.aggressive: aggressive training is not supported under DDP (multi-process); train it on one device"


class NonFiniteError(FloatingPointError):
    """A loss term or the gradient became NaN/Inf; the message names the update and the term."""


def check_finite(module, terms: dict, grad_norm: torch.Tensor, grads: list | None = None) -> None:
    """Stops before a non-finite update reaches the weights (one host sync per update); where the
    device plan defers host reads, zeroes that update's `grads` on the device and stops at the
    next read (`training/host_reads.py`)."""
    values = torch.stack([v.detach().float() for v in terms.values()] + [grad_norm.float()])
    if grads is not None and defers_reads(module):
        check = module.__dict__.setdefault("_finite_check", DeferredFiniteCheck())
        return check.add(values, [*terms, "grad_norm"], module.num_updates + 1, grads)
    finite = bool(torch.isfinite(values).all())
    if module._trainer is not None and module.trainer.world_size > 1:
        # Every rank stops together (one that raised alone would leave the others waiting).
        finite = module.trainer.strategy.reduce_boolean_decision(finite, all=True)
    if finite:
        return
    bad = [k for k, v in zip([*terms, "grad_norm"], values.tolist()) if not math.isfinite(v)] or ["values on another rank"]
    raise NonFiniteError(
        f"non-finite {', '.join(bad)} at update {module.num_updates + 1} "
        f"(epoch {module.trainer.current_epoch}, batch index {module._batch_idx}); "
        "weights not updated, the last checkpoint is kept"
    )


def defers_reads(module) -> bool:
    """The device plan keeps host reads to the logging interval (CUDA), in one process (DDP ranks stop together)."""
    one_process = module._trainer is None or module.trainer.world_size == 1
    return one_process and chunking.chunking_for(module.device.type).host_reads_at_logging_only


def record_loss(module, loss: torch.Tensor, n: int, batch_idx: int) -> bool:
    """Adds a batch's loss to the epoch's mean; False where the step logs nothing (training/host_reads.py)."""
    defer = defers_reads(module)
    module.train_loss_mean.add(module.current_epoch, loss.double() if defer else float(loss), n)
    if not defer:
        return True
    if not logging_now(module.trainer, batch_idx):
        return False
    check = module.__dict__.get("_finite_check")
    if check is not None:
        check.raise_if_any(module, NonFiniteError)
    return True


class SeqVAE(PythonAPI, pl.LightningModule):
    """LSTM encoder → q(z|x) (Gaussian by default) → LSTM decoder p(x|z), trained on rec + w·KL.

    Args:
        vocab_size: Vocabulary size (linked from `data.vocab_size` by the CLI).
        embed_dim: Word embedding size of encoder and decoder (512 in the paper).
        hidden_dim: LSTM size of encoder and decoder (1024 in the paper).
        encoder_hidden_dim: The encoder's LSTM size if not `hidden_dim` (He et al.: enc_nh, dec_nh).
        latent_dim: Size of z (32 in the paper). 0 gives the LSTM language model baseline.
        pooling: Encoder feature: "last" state (reference), "avg"/"max"/"abs" over time, "cls" (Transformer).
        encoder: Not the LSTM: a strategy with `build` (`TransformerEncoder`); same pooling and posterior.
        feature_norm: A norm on the encoder's features before the posterior layer (`IsoBN`); None: off.
        posterior: The family of q(z|x) and its layer (`posteriors.py`); None: `GaussianPosterior` (diagonal).
        dropout_in, dropout_out: Dropout on the decoder's input embeddings, and on its LSTM outputs.
        word_dropout: Probability of replacing each decoder input word after `<s>` by unk (Bowman).
        skip: SkipVAE (Dieng et al. 2019): z also enters the decoder's output layer.
        kl_schedule: KL weight per update (default: linear warm-up from 0.1 over 10 epochs).
        kl_penalty: The KL term in the training loss (default: the true KL; or free bits).
        regularizers: Extra loss terms on encoder features, e.g. CosineDispersion.
        lr: SGD learning rate of both optimisers (1.0 in He et al.).
        optimizer: Not SGD: the optimiser of encoder and decoder (`optimizers.py`: Adam, iVAE's reference).
        grad_clip: Clip the norm of the whole gradient (all parameters together) at this value.
        val_iw_samples: Importance samples for IW-NLL during validation (0: off).
        test_iw_samples: Importance samples for IW-NLL at test (500 in the papers).
        ais: At test, also the AIS estimate of the NLL (`core/ais.py`: `ais_nll`); None: off.
        iw_max_elements: Memory budget of one IW decoder chunk, in logits (B·K·T·V) elements;
            None: 2**26 on CPU, on a GPU a quarter of its free memory in elements (`core/chunking.py`).
        mi_dataset: Also compute MI with the whole evaluation set as the pool (Li et al.).
        eval_seed: Seed of the noise of every evaluation pass (z samples of rec, IW-NLL and MI).
        init_encoder_from: A checkpoint whose encoder replaces this model's before training (pretraining);
            the decoder stays fresh.
        aggressive: Aggressive encoder training (He et al. 2019); None for plain training.
        refine: SA-VAE: q(z|x) refined per batch by SVI steps (`refinement.py`: `SVIRefinement`); None: off.
        bn_gamma: BN-VAE (Zhu et al. 2020): batch-normalise the posterior means with this fixed
            scale γ (learned shift), which keeps E[KL] ≥ Z·γ²/2; None to turn off.
        bn_eps: BatchNorm's ε for BN-VAE (the bound needs the raw means' batch variance ≫ ε; 1e-5: PyTorch's, Zhu et al.'s).
        init: Weight initialisation of both networks: "reference" (He et al.: U(-0.01, 0.01))
            or "pytorch" (PyTorch's fan-in defaults for LSTM and Linear layers); embeddings are
            U(-0.1, 0.1) in both. See `networks.init_weights` for why the choice matters.
        fused_output: Output layer and cross-entropy fused chunk by chunk (`fused_ce`); False: plain logits.
        generation: What `seqvae predict` writes (`Generation`): a predict-time setting, not saved with the hyper-parameters.
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
        fused_output: bool = True,
        encoder_hidden_dim: int | None = None,
        generation: Generation = Generation(),  # noqa: B008 (frozen: immutable default)
        encoder: TransformerEncoder | None = None,
        feature_norm: IsoBN | None = None,
        posterior: Posterior | None = None,
        ais: AIS | None = None,
        optimizer: Optimizer | None = None,
        refine: SVIRefinement | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["generation"])
        self.generation = generation
        generation.resolved()  # refuses a setting its decoding would ignore, before a run directory exists
        self.automatic_optimization = False  # two optimisers; aggressive training steps them apart
        self.kl_schedule = kl_schedule or LinearKLWarmup()
        self.kl_penalty = kl_penalty or StandardKL()
        self.regularizers = list(regularizers or [])
        self.aggressive, self.ais, self.vae_optimizer = aggressive, ais, optimizer  # ais: at test only (`core/ais.py`)
        self.refine = refine and refine.check(self.hparams)
        for name, allowed in MODEL_OPTIONS.items():
            check_option(f"model.{name}", self.hparams[name], allowed)
        strategies = {
            "kl_schedule": self.kl_schedule,
            "kl_penalty": self.kl_penalty,
            "aggressive": aggressive,
            "optimizer": optimizer,
            "refine": refine,
        }
        strategies.update({f"regularizers[{i}]": r for i, r in enumerate(self.regularizers)})
        for option, strategy in strategies.items():
            check_strategy(f"model.{option}", strategy)
        self.encoder, feature_dim = make_encoder(encoder, feature_norm, self.hparams, posterior, self.kl_penalty)
        # the KL penalty's own networks (DualKL's critics); the language model has no KL
        self.penalty_module = self.kl_penalty.build(latent_dim, feature_dim) if self.encoder is not None else None
        self.decoder = LSTMDecoder(
            vocab_size, embed_dim, hidden_dim, latent_dim, dropout_in, dropout_out, skip, init, fused_output
        )
        self.val_metrics = EvalMetrics(latent_dim, feature_dim, mi_dataset, seed=eval_seed)
        self.test_metrics = EvalMetrics(
            latent_dim,
            feature_dim,
            mi_dataset,
            eval_seed,
            per_text=True,
            ais=ais is not None,
            text_columns=self.kl_penalty.text_columns if self.encoder is not None else (),
        )
        self.num_updates = 0  # training batches consumed (outer iterations); drives the KL schedule
        self.encoder_updates = self.decoder_updates = 0  # optimiser steps (encoder > num_updates when aggressive)
        self.fit_seconds = 0.0  # training wall time, accumulated across resumes (FitClock)
        self.vocab: Vocabulary | None = None
        self._noise: EvalNoise | None = None  # this evaluation pass's noise
        self.train_loss_mean = EpochMean()  # the epoch line's train/loss, kept in checkpoints
        self._batch_idx = 0  # for the NonFiniteError message
        self.checks: dict[str, dict] = {}  # each check's record at the last validation or test (`eval_checks.py`)

    # ---------------------------------------------------------------- loss of one batch
    def kl_weight(self) -> float:
        batches_per_epoch = max(1, int(self.trainer.num_training_batches))
        return self.kl_schedule.weight(self.num_updates, batches_per_epoch, self.trainer.max_epochs or 1)

    def decoder_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        inputs = tokens[:, :-1]
        p = self.hparams.word_dropout
        if p > 0 and self.training:
            drop = torch.rand(inputs.shape, device=inputs.device) < p
            drop[:, 0] = False  # `<s>` is kept
            inputs = inputs.masked_fill(drop & (inputs != PAD_ID), UNK_ID)
        return inputs

    def loss_terms(self, batch: dict[str, torch.Tensor], kl_weight: float) -> dict[str, torch.Tensor]:
        """Training loss (mean over sentences) and its parts, one z sample per sentence (`elbo.py`)."""
        tokens, lengths = batch["tokens"], batch["lengths"]
        inputs = self.decoder_inputs(tokens)
        q, h = elbo.encode(self.encoder, tokens, lengths)
        q = q if self.refine is None else self.refine.refined(self, q, tokens, lengths, inputs, kl_weight)
        z = None if q is None else q.sample(1)  # (B, 1, Z): the KL penalty gets it too
        rec, kl_dims = elbo.elbo_terms(self.decoder, q, tokens, lengths, inputs, z, summed=True)  # (B,), (B, Z) or (B, 1)
        if q is None:  # the language model: rec alone
            loss = rec.mean()
            return {"loss": loss, "rec": loss.detach()}
        loss = (rec + kl_weight * self.kl_penalty.term(kl_dims, z[:, 0], h, self.penalty_module)).mean()
        terms = {"rec": rec.mean().detach(), "kl": kl_dims.sum(-1).mean().detach()}
        extra = {reg.name: reg(h) for reg in self.regularizers} | self.encoder.posterior.training_terms(q, kl_weight)
        for name, value in extra.items():  # the posterior's own terms (e.g. WAE-RNF's MMD) after the regularisers
            loss = loss + value
            terms[name] = value.detach()
        terms["loss"] = loss
        return terms

    # ---------------------------------------------------------------- training
    def configure_optimizers(self):
        return vae_optimizers(self.encoder, self.decoder, self.hparams.lr, self.vae_optimizer)

    def configure_callbacks(self):
        have = {type(c) for c in self.trainer.callbacks}  # fit's own test: already attached
        return [c for c in (ExactResume(), FitClock(), EvalMemory(), *(k() for k in self.eval_checks())) if type(c) not in have]

    def eval_checks(self) -> list[type]:  # what qualifies its numbers: BN-VAE's bound, those its posterior declares
        return [k for k in (BNBoundCheck, *getattr(self.encoder, "posterior", Posterior()).checks) if k.applies(self)]

    def _optimizers(self) -> list:
        return opts if isinstance(opts := self.optimizers(), list) else [opts]

    def update_step(self, batch, kl_weight: float, stepped: torch.nn.Module | None = None, clip_joint: bool = False) -> dict:
        """One SGD update on `batch`: of the whole model, or of `stepped` only (the other
        module's weights then get no gradients at all; gradients still flow through them).
        `clip_joint` (the reference's aggressive steps): the other module's gradients are computed
        too, the norm of ALL gradients is clipped, and only `stepped` is updated."""
        opts = self._optimizers()
        other_modules = [m for m in (self.encoder, self.decoder) if m is not None and stepped is not None and m is not stepped]
        others = [p for m in other_modules for p in m.parameters()]
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
        check_finite(self, terms, grad_norm, [p.grad for p in params])
        for p in others:  # clip_joint: computed for the norm only; SGD skips a None grad
            p.grad = None
        for opt in opts:
            opt.step()  # SGD skips parameters whose grad is None
        return {k: v.detach() for k, v in terms.items()}

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
        self.decoder_updates, self.num_updates = self.decoder_updates + 1, self.num_updates + 1
        if not record_loss(self, terms["loss"], batch["tokens"].size(0), batch_idx):
            return  # on CUDA the values stay on the device until Lightning logs them
        self.log_dict({f"train/{k}": v for k, v in terms.items()}, batch_size=batch["tokens"].size(0), prog_bar=True)
        self.log("train/kl_weight", weight, prog_bar=True)
        counts = {"encoder_updates": self.encoder_updates, "decoder_updates": self.decoder_updates}
        self.log_dict({f"train/{k}": float(v) for k, v in counts.items()})

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
            self.encoder.load_state_dict(pretrained_encoder(self.hparams.init_encoder_from, self.encoder, self.vocab))

    # ---------------------------------------------------------------- evaluation
    def iw_chunk(self, tokens: torch.Tensor) -> int:
        return iw_chunk(tokens, self.hparams.vocab_size, self.hparams.iw_max_elements)

    def _log_eval(self, stage: str, metrics: EvalMetrics) -> dict[str, float]:
        values = {f"{stage}/{k}": v for k, v in metrics.compute().items()}
        metrics.reset()
        self.log_dict(values)
        return values

    def on_validation_epoch_start(self):
        self._noise = EvalNoise.start(self)

    on_test_epoch_start = on_validation_epoch_start

    def validation_step(self, batch, batch_idx):
        evaluate_batch(self, batch, self.val_metrics, self.hparams.val_iw_samples)

    def on_validation_epoch_end(self):
        values = self._log_eval("val", self.val_metrics)
        if not self.trainer.sanity_checking and self.trainer.state.fn == "fit":
            if self.aggressive is not None and self.aggressive.active:
                self.aggressive.end_epoch(float(values["val/mi"]))
            self.log("train/aggressive", float(self.aggressive is not None and self.aggressive.active))
            self.log("train/lr", self._optimizers()[0].param_groups[0]["lr"])

    def test_step(self, batch, batch_idx):
        evaluate_batch(self, batch, self.test_metrics, self.hparams.test_iw_samples, self.ais)

    def on_test_epoch_end(self):
        self._log_eval("test", self.test_metrics)  # the callbacks took their values first (PerTextRows, LatentDimensions)

    def on_predict_start(self):
        self._predictor = Predictor(self)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self._predictor.step(batch, batch_idx, dataloader_idx)

    # ---------------------------------------------------------------- checkpoint state
    def on_save_checkpoint(self, checkpoint):
        state = checkpoint.setdefault("seqvae", {})  # ExactResume adds the RNG states
        state.update(num_updates=self.num_updates, encoder_updates=self.encoder_updates)
        state.update(decoder_updates=self.decoder_updates, fit_seconds=self.fit_seconds)
        state["train_loss_mean"], state["checks"] = self.train_loss_mean.state_dict(), self.checks
        if self.aggressive is not None:
            state["aggressive"] = self.aggressive.state_dict()
        if self.vocab is not None:
            checkpoint["vocab"] = self.vocab.to_str()

    def on_load_checkpoint(self, checkpoint):
        state = checkpoint.get("seqvae", {})
        self.num_updates, self.fit_seconds = state.get("num_updates", 0), state.get("fit_seconds", 0.0)
        self.encoder_updates, self.decoder_updates = state.get("encoder_updates", 0), state.get("decoder_updates", 0)
        if "train_loss_mean" in state:
            self.train_loss_mean.load_state_dict(state["train_loss_mean"])
        self.checks = state.get("checks", {"bn_bound": state["bn_bound"]} if state.get("bn_bound") else {})  # older: BN-VAE's
        if self.aggressive is not None and "aggressive" in state:
            self.aggressive.load_state_dict(state["aggressive"])
        self.vocab = Vocabulary.from_str(checkpoint["vocab"]) if "vocab" in checkpoint else self.vocab

    def run_flags(self) -> dict:  # metrics.json's records of the checks that qualify its numbers (None: not measured)
        return {check.key: self.checks.get(check.key) for check in self.eval_checks()}
