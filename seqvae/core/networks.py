"""The networks of He et al. (2019): an LSTM encoder with a choice of feature pooling
(Long et al.) and an LSTM decoder that sees z at every step and in its initial state.

Shapes: tokens (B, T) with `<s>` first; mask (B, T) true on real steps; lengths (B,);
features h (B, H); mu, logvar (B, Z); z (B, K, Z).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqvae.core import chunking
from seqvae.core.features import POOLINGS, Init, Pooling, PosteriorEncoder, bn_vae_norm  # noqa: F401  (Pooling: API)
from seqvae.core.fused_ce import linear_cross_entropy
from seqvae.core.posteriors import GaussianPosterior, Posterior
from seqvae.errors import ConfigError
from seqvae.store.checkpoints import load_checkpoint, require_run_checkpoint
from seqvae.text.corpus import Vocabulary


def init_weights(module: nn.Module, init: Init = "reference") -> None:
    """Embeddings U(-0.1, 0.1) in both schemes. "reference" (He et al.'s): every other weight
    U(-0.01, 0.01). "pytorch": LSTM and Linear layers keep PyTorch's default U(-1/√fan_in,
    1/√fan_in) (U(-0.088, 0.088) at 128 units).

    Why "pytorch" exists: the reference scale puts a small encoder next to a saddle. Its features
    and the posterior layer are both ~0.01, so the gradient of each is scaled by the other; on a
    toy task that needs 2 bits of z (`test_encoder_init_decides_whether_an_autoencoder_encodes`)
    SGD never leaves it. On yahoo10k (128 units) a max-pooled autoencoder encodes with "pytorch"
    and not with "reference" (docs/notes/results_lab_2026-12.md, "the weight initialisation")."""
    if init not in ("reference", "pytorch"):
        raise ValueError(f"init must be 'reference' or 'pytorch', got {init!r}")
    if init == "reference":
        for p in module.parameters():
            nn.init.uniform_(p, -0.01, 0.01)
    for m in module.modules():
        if isinstance(m, nn.Embedding):
            nn.init.uniform_(m.weight, -0.1, 0.1)
        elif hasattr(m, "init_own_parameters"):  # a module with its own initial values in both schemes (a planar flow's N(0, I))
            m.init_own_parameters()


class LSTMEncoder(PosteriorEncoder):
    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_dim: int,
        latent_dim: int,
        pooling: Pooling,
        bn_gamma: float | None = None,
        bn_eps: float = 1e-5,
        init: Init = "reference",
        posterior: Posterior | None = None,
    ):
        super().__init__()
        self.posterior = posterior or GaussianPosterior()
        if pooling not in POOLINGS:
            raise ConfigError(f"model.pooling: {pooling!r} is not an LSTM encoder's feature (choose from {', '.join(POOLINGS)})")
        self.pool = POOLINGS[pooling]
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.lstm = nn.LSTM(embed_dim, hidden_dim, batch_first=True)
        self.to_posterior = self.posterior.layer(hidden_dim, latent_dim)
        init_weights(self, init)
        self.mean_norm = bn_vae_norm(latent_dim, bn_gamma, bn_eps)
        self.feature_dim = hidden_dim

    def features(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(tokens.size(1), device=tokens.device) < lengths.unsqueeze(1)  # (B, T)
        h, _ = self.lstm(self.embed(tokens))  # (B, T, H)
        return self.pool(h, mask, lengths)  # (B, H)


def encoder_optimizer(encoder: nn.Module, lr: float, optimizer=None) -> torch.optim.Optimizer:
    """The encoder's own choice (`TransformerNet.make_optimizer`), else `optimizer` (model.optimizer,
    `core/optimizers.py`), else He et al.'s SGD at model.lr."""
    make = getattr(encoder, "make_optimizer", None)
    if make is not None:
        return make(lr)
    return optimizer.make(encoder.parameters(), lr) if optimizer is not None else torch.optim.SGD(encoder.parameters(), lr=lr)


def vae_optimizers(encoder: nn.Module | None, decoder: nn.Module, lr: float, optimizer=None) -> list[torch.optim.Optimizer]:
    """The encoder's optimiser (none for the language model) and the decoder's: `optimizer`
    (model.optimizer, `core/optimizers.py`), else He et al.'s SGD at model.lr."""
    dec = optimizer.make(decoder.parameters(), lr) if optimizer is not None else torch.optim.SGD(decoder.parameters(), lr=lr)
    return [dec] if encoder is None else [encoder_optimizer(encoder, lr, optimizer), dec]


def make_encoder(encoder, feature_norm, h, posterior=None, kl_penalty=None) -> tuple[nn.Module | None, int]:
    """The encoder of SeqVAE's hyper-parameters `h` and its feature size: `encoder.build(...)`
    when a strategy is chosen (`model.encoder`, e.g. the Transformer), else the LSTM of
    `embed_dim` and `encoder_hidden_dim or hidden_dim`; None for the language model (latent 0).
    `feature_norm` (IsoBN), when set, becomes the encoder's `feature_norm` (`posterior_of`); `posterior`
    (default `GaussianPosterior`) its posterior, refused with a `kl_penalty` it cannot serve."""
    if encoder is not None and h.encoder_hidden_dim is not None:
        raise ConfigError("model.encoder_hidden_dim: sets the LSTM encoder's size; with model.encoder, set its init_args")
    if not h.latent_dim:
        if feature_norm is not None:
            raise ConfigError("model.feature_norm: the language model (latent_dim 0) has no encoder features to normalise")
        return None, h.encoder_hidden_dim or h.hidden_dim
    posterior = posterior or GaussianPosterior()
    posterior.check_penalty(kl_penalty)
    if h.bn_gamma is not None and not posterior.bn_vae:
        raise ConfigError(
            f"model.bn_gamma: BN-VAE's norm is not defined for model.posterior {type(posterior).__name__}; set it null"
        )
    args = (h.latent_dim, h.pooling, h.bn_gamma, h.bn_eps, h.init, posterior)
    if encoder is not None:
        net = encoder.build(h.vocab_size, *args)
    else:
        net = LSTMEncoder(h.vocab_size, h.embed_dim, h.encoder_hidden_dim or h.hidden_dim, *args)
    if feature_norm is not None:
        net.feature_norm = feature_norm.build(net.feature_dim)
    return net, net.feature_dim


def pretrained_encoder(path: str, encoder: torch.nn.Module, vocab: Vocabulary | None = None, mmap: bool = False) -> dict:
    """The encoder weights of checkpoint `path` (`model.init_encoder_from`), refused in one line
    unless every tensor has the shape `encoder`'s has and (given `vocab`) the vocabularies agree:
    embeddings read through another vocabulary would be other words' vectors, silently."""
    ckpt = require_run_checkpoint(load_checkpoint(path, "model.init_encoder_from", mmap=mmap), path, "model.init_encoder_from")
    if vocab is not None and "vocab" in ckpt:
        if Vocabulary.from_str(ckpt["vocab"]).tokenizer.get_vocab() != vocab.tokenizer.get_vocab():
            raise ConfigError(f"model.init_encoder_from: {path} was trained with another vocabulary than this run's data")
    state = ckpt["state_dict"]
    theirs = {k[len("encoder.") :]: v for k, v in state.items() if k.startswith("encoder.")}
    for name, own in encoder.state_dict().items():
        if name not in theirs or theirs[name].shape != own.shape:
            found = tuple(theirs[name].shape) if name in theirs else "missing"
            raise ConfigError(
                f"model.init_encoder_from: {path}: encoder.{name} is {found} there, {tuple(own.shape)} here "
                "(embed_dim, encoder_hidden_dim/hidden_dim, latent_dim, bn_gamma and the vocabulary must match)"
            )
    return theirs


class LSTMDecoder(nn.Module):
    """p(x | z). With `latent_dim=0` it is a plain LSTM language model (zero initial state).

    Args mirror the reference: dropout on the input embeddings and on the LSTM outputs; with
    `skip=True` (SkipVAE, Dieng et al. 2019) z also enters the output layer. `fused_output`:
    `log_likelihood` runs the output layer and the cross-entropy fused, chunk by chunk
    (`fused_ce.linear_cross_entropy`); False: through `forward`'s logits (same values to ~1e-6).
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        hidden_dim: int,
        latent_dim: int,
        dropout_in: float = 0.5,
        dropout_out: float = 0.5,
        skip: bool = False,
        init: Init = "reference",
        fused_output: bool = True,
    ):
        super().__init__()
        self.latent_dim, self.skip = latent_dim, skip and latent_dim > 0
        self.fused_output = fused_output  # log_likelihood without the N×V logits (`fused_ce`); False: the plain path
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.dropout_in, self.dropout_out = nn.Dropout(dropout_in), nn.Dropout(dropout_out)
        self.lstm = nn.LSTM(embed_dim + latent_dim, hidden_dim, batch_first=True)
        self.z_to_c0 = nn.Linear(latent_dim, hidden_dim, bias=False) if latent_dim else None
        # SkipVAE: the output layer reads [h; z], i.e. logits = W_h h + W_z z. Dropout stays on h
        # only: dropping parts of z would be a second, unasked-for word-dropout-like noise.
        self.z_to_out = nn.Linear(latent_dim, vocab_size, bias=False) if self.skip else None
        self.out = nn.Linear(hidden_dim, vocab_size, bias=False)
        init_weights(self, init)

    def forward(self, inputs: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """inputs (N, T) decoder input ids; z (N, Z) or None -> logits (N, T, V)."""
        h = self.states(inputs, z)
        # One (N·T, H) x (H, V) GEMM. Left 3-D, torch.matmul does not fold the batch into rows
        # when the input needs a gradient and the weight does not (the frozen decoder of an
        # aggressive encoder step) and runs N small batched GEMMs instead, which on CPU cost
        # more than the weight gradient saves. Same kernel and values as the folded case.
        logits = self.out(h.reshape(-1, h.size(-1))).view(*h.shape[:-1], -1)  # (N, T, V)
        if self.skip:
            logits = logits + self.z_to_out(z).unsqueeze(1)
        return logits

    def states(self, inputs: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        """What the output layer reads: dropout(LSTM outputs) (N, T, H) for inputs (N, T), z (N, Z)."""
        x = self.dropout_in(self.embed(inputs))  # (N, T, E)
        state = None
        if self.latent_dim:
            x = torch.cat([x, z.unsqueeze(1).expand(-1, x.size(1), -1)], dim=-1)
            c0 = self.z_to_c0(z).unsqueeze(0)  # (1, N, H)
            state = (torch.tanh(c0), c0)
        out, _ = self.lstm(x, state)  # (N, T, H)
        return self.dropout_out(out)

    def _start(self, z: torch.Tensor | None):
        """The decoder's initial LSTM state for z (n, Z): c0 = W z, h0 = tanh(c0); None without z."""
        if not self.latent_dim:
            return None
        c0 = self.z_to_c0(z).unsqueeze(0)
        return (torch.tanh(c0), c0)

    def _step(self, x: torch.Tensor, state, z: torch.Tensor | None):
        """One decoding step: previous ids x (n,) -> next-token logits (n, V) and the new state."""
        inp = self.embed(x.unsqueeze(1))  # (n, 1, E)
        if self.latent_dim:
            inp = torch.cat([inp, z.unsqueeze(1)], dim=-1)
        h, state = self.lstm(inp, state)
        logits = self.out(h[:, -1])  # (n, V)
        if self.skip:
            logits = logits + self.z_to_out(z)
        return logits, state

    @torch.no_grad()
    def generate(
        self,
        z: torch.Tensor | None,
        n: int,
        bos_id: int,
        eos_id: int,
        max_length: int = 100,
        temperature: float = 0.0,
        generator=None,
    ):
        """Decodes n sequences step by step from z (n, Z) (or none: the language model):
        greedy when temperature is 0, else sampling from softmax(logits / temperature).
        Returns ids (n, L) without `<s>`; a sequence ends at its first `</s>`."""
        device = self.out.weight.device
        state = self._start(z)
        x = torch.full((n,), bos_id, dtype=torch.long, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        out = []
        for _ in range(max_length):
            logits, state = self._step(x, state, z)
            if temperature > 0:
                nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator).squeeze(1)
            else:
                nxt = logits.argmax(-1)
            nxt = nxt.masked_fill(done, eos_id)
            out.append(nxt)
            done |= nxt == eos_id
            if bool(done.all()):
                break
            x = nxt
        return torch.stack(out, dim=1)

    @torch.no_grad()
    def beam_search(
        self, z: torch.Tensor | None, n: int, bos_id: int, eos_id: int, max_length: int = 100, beam_width: int = 5
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The most probable sequence per z (n, Z) that a beam of `beam_width` hypotheses finds,
        batched over the n inputs. Returns ids (n, L) as `generate` does, and their scores (n,).

        The score of a hypothesis is the plain sum of log p(token | prefix, z) over its tokens,
        `</s>` included (no length normalisation, so shorter texts are favoured exactly as the
        model's probabilities favour them). A hypothesis is finished at `</s>`: it stays in the
        beam with its score frozen and competes with the open ones. Hypotheses still open after
        `max_length` tokens compete with their partial score. Extending a hypothesis never raises
        its score, so the search stops as soon as every input's best hypothesis is finished.
        With `beam_width=1` this is greedy decoding."""
        if beam_width < 1:
            raise ValueError(f"beam_width must be at least 1, got {beam_width}")
        device = self.out.weight.device
        w = beam_width
        zz = None if z is None else z.repeat_interleave(w, 0)  # (n·W, Z), row i·W + j is beam j of input i
        state = self._start(zz)
        x = torch.full((n * w,), bos_id, dtype=torch.long, device=device)
        scores = torch.full((n, w), float("-inf"), device=device)
        scores[:, 0] = 0.0  # one live hypothesis (`<s>`) at the start
        finished = torch.zeros(n, w, dtype=torch.bool, device=device)
        history = torch.empty(n, w, 0, dtype=torch.long, device=device)
        rows = torch.arange(n, device=device).unsqueeze(1)  # (n, 1)
        for _ in range(max_length):
            logits, state = self._step(x, state, zz)
            logp = torch.log_softmax(logits.float(), -1).view(n, w, -1)  # (n, W, V)
            vocab = logp.size(-1)
            # A finished hypothesis has one continuation, `</s>` again, at no cost.
            frozen = torch.full_like(logp[0, 0], float("-inf"))
            frozen[eos_id] = 0.0
            logp = torch.where(finished.unsqueeze(-1), frozen, logp)
            candidates = (scores.unsqueeze(-1) + logp).view(n, w * vocab)
            scores, index = candidates.topk(w, dim=-1)  # sorted, best first
            origin, token = index // vocab, index % vocab  # (n, W)
            history = torch.cat([history[rows, origin], token.unsqueeze(-1)], dim=-1)
            finished = finished[rows, origin] | (token == eos_id)
            if bool(finished[:, 0].all()):
                break
            flat = (rows * w + origin).view(-1)
            if state is not None:
                state = tuple(s[:, flat] for s in state)
            x = token.view(-1)
        return history[:, 0], scores[:, 0]

    def log_likelihood(self, tokens: torch.Tensor, lengths: torch.Tensor, z: torch.Tensor | None, inputs=None, summed=False):
        """log p(x | z) summed over the n + 1 predicted tokens.

        tokens (B, T) `<s> … </s>`; z (B, K, Z) or None -> (B, K) (K = 1 without z).
        `inputs` replaces the decoder's input ids (word dropout); default tokens[:, :-1].
        `summed`: the caller's loss is a sum or mean over the (B, K) values (the training loss):
        the fused backward then need not test its incoming gradient (a host sync on a GPU).
        """
        B, T = tokens.shape
        K = 1 if z is None else z.size(1)
        inputs = tokens[:, :-1] if inputs is None else inputs
        targets = tokens[:, 1:]  # (B, T-1)
        flat_z = None if z is None else z.reshape(B * K, -1)
        targets = targets.repeat_interleave(K, 0).reshape(-1)  # (B*K*(T-1),)
        mask = torch.arange(T - 1, device=tokens.device) < (lengths - 1).unsqueeze(1)  # (B, T-1)
        # The per-token NLL is fp32 under bf16 autocast too: sums of ~100 log-probs.
        if self.fused_output:
            h = self.states(inputs.repeat_interleave(K, 0), flat_z)  # (B*K, T-1, H), dropout applied
            plan = chunking.chunking_for(tokens.device.type)
            if not plan.select_real:  # every row, padding weighted 0: no host sync (core/chunking.py)
                skip = self.z_to_out(flat_z) if self.skip else None
                trains = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, self.out.weight, skip))
                seq = torch.arange(B * K, device=tokens.device).repeat_interleave(T - 1)
                weight = mask.repeat_interleave(K, 0).reshape(-1).float()
                rows = plan.rows(self.out.weight.size(0), trains)
                nll = linear_cross_entropy(h.reshape(-1, h.size(-1)), self.out.weight, targets, skip, seq, rows, weight, summed)
                return -nll.view(B, K, T - 1).sum(-1)
            # Real tokens only (padding costs nothing, and every row then has the same loss
            # gradient: fused_ce's one-pass case). Rows are (sequence, step) as 2-D GEMM rows;
            # the skip term is one row per sequence, picked per token by `seq`.
            real = mask.repeat_interleave(K, 0).reshape(-1)
            seq = torch.arange(B * K, device=tokens.device).repeat_interleave(T - 1)[real]
            skip = self.z_to_out(flat_z) if self.skip else None  # (B*K, V)
            picked = linear_cross_entropy(
                h.reshape(-1, h.size(-1))[real], self.out.weight, targets[real], skip, seq, uniform_grad=summed
            )
            nll = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device).masked_scatter(real, picked)
        else:
            logits = self(inputs.repeat_interleave(K, 0), flat_z)  # (B*K, T-1, V)
            wide = torch.promote_types(logits.dtype, torch.float32)  # fp32 under bf16; float64 stays (gradient checks)
            nll = F.cross_entropy(logits.to(wide).reshape(targets.size(0), -1), targets, reduction="none")
        return -(nll.view(B, K, T - 1) * mask.unsqueeze(1)).sum(-1)
