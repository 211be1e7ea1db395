"""A Transformer encoder for the sequence VAE (issue 38): token + learned position embeddings,
pre-norm self-attention layers with padding masks, then the same features as the LSTM encoder
(`model.pooling`) and the same posterior layer (BN-VAE included, `features.posterior_of`).

Chosen in YAML as a strategy, like the KL schedule (`configs/transformer/encoder.yaml`):

    model:
      encoder:
        class_path: seqvae.core.transformer.TransformerEncoder
        init_args: {d_model: 128, layers: 2, heads: 4}

`TransformerEncoder` holds only settings (it is pickled into checkpoints' hyper-parameters, so it
stays a plain object that `torch.load(weights_only=True)` may read); `SeqVAE` calls `build` with
what the model knows (vocabulary, latent size, pooling, BN-VAE, init) and gets the module.

Features (`model.pooling`): "cls" is the output at `<s>` (position 0, the [CLS] token's analogue
and the counterpart of the LSTM's last state), "last" the output at the last real step, and
"avg" / "max" / "abs" pool over the real steps. Padding is masked out of attention as keys, so
the outputs at real steps, and every feature, do not depend on the padding.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from seqvae.core.features import POOLINGS, Init, PosteriorEncoder, bn_vae_norm
from seqvae.core.posteriors import GaussianPosterior, Posterior
from seqvae.errors import ConfigError
from seqvae.options import AT_LEAST_ONE, Range, check_strategy
from seqvae.store.strategies import strategy

FEATURES = {"cls": lambda h, mask, lengths: h[:, 0], **POOLINGS}


@strategy
class TransformerEncoder:
    """Settings of a Transformer encoder: width `d_model`, `layers` pre-norm layers of `heads`
    heads, feed-forward width `ff_dim` (None: 4·d_model), `dropout` inside the layers, and
    `max_length` learned positions (texts are `<s>` … `</s>`, so at most data.max_length + 2).

    `optimizer` / `lr`: the encoder's own optimiser. "sgd" with `lr` None is He et al.'s LSTM
    protocol (SGD at model.lr, 1.0). Why "adam" exists: at SGD lr 1.0 a Transformer encoder's
    updates can overflow (docs/results.md §7: 1 of 9 runs without IsoBN and 7 of 9 with it ended
    in a non-finite gradient on yahoo10k); Adam bounds each step by its lr (Optimus and BERT
    fine-tuning use Adam). The decoder keeps SGD at model.lr; the plateau rule scales both."""

    option_ranges = {
        "d_model": AT_LEAST_ONE,
        "layers": AT_LEAST_ONE,
        "heads": AT_LEAST_ONE,
        "max_length": AT_LEAST_ONE,
        "ff_dim": Range(lambda v: v is None or v >= 1, ">= 1 (null: 4·d_model)"),
        "dropout": Range(lambda v: 0 <= v < 1, "in [0, 1)"),
        "optimizer": Range(lambda v: v in ("sgd", "adam"), "sgd or adam"),
        "lr": Range(lambda v: v is None or v > 0, "> 0 (null: model.lr)"),
    }
    optimizer, lr = "sgd", None  # class defaults: settings pickled before these two options existed load as SGD

    def __init__(
        self,
        d_model: int = 128,
        layers: int = 2,
        heads: int = 4,
        ff_dim: int | None = None,
        dropout: float = 0.1,
        max_length: int = 512,
        optimizer: Literal["sgd", "adam"] = "sgd",
        lr: float | None = None,
    ):
        self.d_model, self.layers, self.heads, self.ff_dim = d_model, layers, heads, ff_dim
        self.dropout, self.max_length, self.optimizer, self.lr = dropout, max_length, optimizer, lr

    def make_optimizer(self, params, model_lr: float) -> torch.optim.Optimizer:
        lr = self.lr or model_lr
        return torch.optim.Adam(params, lr=lr) if self.optimizer == "adam" else torch.optim.SGD(params, lr=lr)

    def build(
        self,
        vocab_size: int,
        latent_dim: int,
        pooling: str,
        bn_gamma: float | None,
        bn_eps: float,
        init: Init,
        posterior: Posterior | None = None,
    ) -> TransformerNet:
        return TransformerNet(self, vocab_size, latent_dim, pooling, bn_gamma, bn_eps, init, posterior)

    def __repr__(self) -> str:
        return (
            f"TransformerEncoder(d_model={self.d_model}, layers={self.layers}, heads={self.heads}, "
            f"ff_dim={self.ff_dim}, dropout={self.dropout}, max_length={self.max_length}, "
            f"optimizer={self.optimizer!r}, lr={self.lr})"
        )


class TransformerNet(PosteriorEncoder):
    def __init__(
        self,
        s: TransformerEncoder,
        vocab_size: int,
        latent_dim: int,
        pooling: str,
        bn_gamma: float | None,
        bn_eps: float,
        init: Init,
        posterior: Posterior | None = None,
    ):
        super().__init__()
        self.posterior = posterior or GaussianPosterior()
        check_strategy("model.encoder", s)
        if s.d_model % s.heads:
            raise ConfigError(f"model.encoder.init_args.heads: {s.heads} does not divide d_model {s.d_model}")
        if pooling not in FEATURES:
            raise ConfigError(
                f"model.pooling: {pooling!r} is not a Transformer encoder's feature (choose from {', '.join(FEATURES)})"
            )
        self.pool, self.max_length, self.feature_dim, self.settings = FEATURES[pooling], s.max_length, s.d_model, s
        self.embed = nn.Embedding(vocab_size, s.d_model)
        self.position = nn.Embedding(s.max_length, s.d_model)
        layer = nn.TransformerEncoderLayer(
            s.d_model, s.heads, s.ff_dim or 4 * s.d_model, s.dropout, batch_first=True, norm_first=True
        )
        # Pre-norm layers leave the residual stream un-normalised: a final LayerNorm, as in GPT-2 / ViT.
        self.layers = nn.TransformerEncoder(layer, s.layers, norm=nn.LayerNorm(s.d_model), enable_nested_tensor=False)
        self.to_posterior = self.posterior.layer(s.d_model, latent_dim)
        # Why not He et al.'s U(-0.01, 0.01) everywhere (`init_weights`): it would set LayerNorm's
        # gains to ~0.01 and shrink attention to near-uniform. The layers keep PyTorch's defaults,
        # embeddings N(0, 0.02) (GPT-2's); `init` sets the posterior layer only, as it does the LSTM's.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.position.weight, std=0.02)
        if init == "reference":
            nn.init.uniform_(self.to_posterior.weight, -0.01, 0.01)
        self.mean_norm = bn_vae_norm(latent_dim, bn_gamma, bn_eps)

    def make_optimizer(self, model_lr: float) -> torch.optim.Optimizer:
        return self.settings.make_optimizer(self.parameters(), model_lr)

    def features(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        T = tokens.size(1)
        if T > self.max_length:
            raise ConfigError(
                f"model.encoder.init_args.max_length: a batch of {T} tokens (with <s> and </s>) exceeds the encoder's "
                f"{self.max_length} positions"
            )
        mask = torch.arange(T, device=tokens.device) < lengths.unsqueeze(1)  # (B, T)
        x = self.embed(tokens) + self.position.weight[:T]
        h = self.layers(x, src_key_padding_mask=~mask)  # (B, T, d)
        return self.pool(h, mask, lengths)
