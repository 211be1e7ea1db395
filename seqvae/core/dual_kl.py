"""iVAE's KL term (Fang et al. 2019; ../shared/SPEC.md §11.2–11.5): a critic's dual estimate of
the KL in the training loss, and the reference's test estimates (NLL-bar, dual KL, dual MI).

For any function T, KL(Q‖P) ≥ E_Q[T] − E_P[exp T] + 1 (the NWJ / f-divergence dual), with
equality at T = log dQ/dP. Two critics estimate it:
- ν_xz(z, h): Q = q(z|x) with the text's encoder features h, P = N(0, I) with the same h; its
  mean over texts estimates E_x KL(q(z|x)‖p) (iVAE, `critic: xz`);
- ν_z(z): Q = the aggregate posterior (the batch's draws), P = N(0, I): KL(q(z)‖p) (iVAE_MI,
  `critic: z`, whose loss is then the −ELBO less β·MI: a bound on nothing; judge it by IW-NLL).
Both are trained in both variants (ν_z gives the dual MI at test), each by its own Adam on
mean_i [exp T(z̃_i) − T(z_i)], z̃_i ~ N(0, I) redrawn at every step, z_i the batch's posterior
draws detached: `steps` rounds per training batch, each one ν_xz step then one ν_z step.

The VAE's loss takes β · mean_i T(z_i) of the chosen critic with the critic's weights held
constant (the gradient reaches the encoder through z_i alone; h is detached, as the reference's
encoder returns it), so the VAE's step leaves the critics bit-identical and the critics' steps
(on detached z, h) leave the VAE bit-identical (tests/test_dual_kl.py). The dual value is a lower
bound of the KL for any critic: the loss's KL term, and the NLL-bar built from it, are biased
low; seqvae's own metrics (closed-form KL, IW-NLL) stay the exact ones.

The critics and their optimisers' states are a submodule of the model (`Critics`), so
checkpoints hold them and a resumed run is exact. Not for DDP (the critics' steps are not
all-reduced): refused there.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn

from seqvae.core.losses import KLPenalty
from seqvae.errors import ConfigError
from seqvae.options import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range

DDP_REFUSED = "model.kl_penalty: DualKL's critics are stepped in one process only; train it on one device"
TEST_NOISE_STREAM = 3  # after evaluation.STREAMS' rec, iw, mi: the reference estimates' own draws


def critic_net(in_dim: int, hidden: int, layers: int) -> nn.Sequential:
    """The reference's critic: `layers` hidden Linear layers of width `hidden`, LeakyReLU (0.01)
    after each, a linear scalar output; PyTorch's default init."""
    parts, width = [], in_dim
    for _ in range(layers):
        parts += [nn.Linear(width, hidden), nn.LeakyReLU(0.01)]
        width = hidden
    return nn.Sequential(*parts, nn.Linear(width, 1))


def nwj_dual(t_q: torch.Tensor, t_p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """E_Q[T] − E_P[exp T] + 1 from T at draws of Q (`t_q`) and of P (`t_p`), averaged along `dim`."""
    return t_q.mean(dim) - t_p.exp().mean(dim) + 1


class Critics(nn.Module):
    """ν_xz and ν_z with their Adam optimisers, whose states travel in the state dict
    (`get_extra_state`): a checkpoint holds the critics whole."""

    def __init__(self, latent_dim: int, feature_dim: int, hidden: int, layers: int, lr: float):
        super().__init__()
        self.xz = critic_net(latent_dim + feature_dim, hidden, layers)
        self.z = critic_net(latent_dim, hidden, layers)
        self.optimizers = [torch.optim.Adam(net.parameters(), lr=lr) for net in (self.xz, self.z)]
        self._loaded: list[dict] | None = None  # optimiser states read before the weights reached their device

    def t_xz(self, z: torch.Tensor, h: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        """ν_xz at z (..., Z) with features h (..., H): (...)."""
        return self._critic_value(self.xz, torch.cat([z, h], -1), frozen)

    def t_z(self, z: torch.Tensor, frozen: bool = False) -> torch.Tensor:
        return self._critic_value(self.z, z, frozen)

    @staticmethod
    def _critic_value(net: nn.Module, x: torch.Tensor, frozen: bool) -> torch.Tensor:
        if not frozen:
            return net(x.to(net[0].weight.dtype)).squeeze(-1)
        # The weights as constants: the gradient reaches x, never the critic.
        weights = {name: p.detach() for name, p in net.named_parameters()}
        return torch.func.functional_call(net, weights, (x.to(net[0].weight.dtype),)).squeeze(-1)

    def train_steps(self, z: torch.Tensor, h: torch.Tensor, steps: int) -> None:
        """`steps` rounds of one ν_xz and one ν_z Adam step on the batch's draws z (B, Z) and
        features h (B, H), both detached; the gradients are cleared after each step, so the VAE's
        update sees none of them."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            raise ConfigError(DDP_REFUSED)
        self._restore_optimizers()
        z, h = z.detach().float(), h.detach().float()
        with torch.enable_grad():
            for _ in range(steps):
                for critic, opt in zip((lambda v: self.t_xz(v, h), self.t_z), self.optimizers):
                    prior = torch.randn_like(z)
                    loss = (critic(prior).exp() - critic(z)).mean()
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

    def get_extra_state(self) -> list[dict]:
        return self._loaded if self._loaded is not None else [opt.state_dict() for opt in self.optimizers]

    def set_extra_state(self, state: list[dict]) -> None:
        # Applied at the next step: Adam casts its state to where the weights are then (a
        # checkpoint may be read before the model moves to its device).
        self._loaded = state

    def _restore_optimizers(self) -> None:
        if self._loaded is not None:
            for opt, state in zip(self.optimizers, self._loaded):
                opt.load_state_dict(state)
            self._loaded = None


class DualKL(KLPenalty):
    """iVAE's KL term (Fang et al. 2019; SPEC §11.2–11.3): β · mean_i T(z_i) of a critic trained
    `steps` Adam steps (lr `lr`) per training batch on the NWJ dual. Use it with
    `model.posterior: FullCovGaussianPosterior` (iVAE's encoder; any posterior works).

    Args:
        critic: Which critic enters the loss: "xz" (ν_xz(z, h), E_x KL(q(z|x)‖p): iVAE) or "z"
            (ν_z(z), KL(q(z)‖p): iVAE_MI). Both are trained either way.
        steps: Critic rounds per training batch (5 in the reference); 0 leaves them untrained.
        lr: Adam learning rate of each critic (1e-5 in the reference).
        hidden: Width of the critics' hidden layers (512 in the reference).
        layers: Hidden layers of each critic (3 in the reference).
        test_samples: Posterior and prior draws per text of the reference's test estimates
            (128 in the reference; 0: not computed).
    """

    per_dimension = False  # the dual estimates the whole KL, not its dimensions
    option_ranges = {
        "critic": Range(lambda v: v in ("xz", "z"), "xz or z"),
        "steps": NON_NEGATIVE,
        "lr": POSITIVE,
        "hidden": AT_LEAST_ONE,
        "layers": AT_LEAST_ONE,
        "test_samples": NON_NEGATIVE,
    }

    def __init__(
        self,
        critic: Literal["xz", "z"] = "xz",
        steps: int = 5,
        lr: float = 1e-5,
        hidden: int = 512,
        layers: int = 3,
        test_samples: int = 128,
    ):
        self.critic, self.steps, self.lr, self.hidden, self.layers = critic, steps, lr, hidden, layers
        self.test_samples = test_samples

    def __repr__(self) -> str:
        return (
            f"DualKL(critic={self.critic!r}, steps={self.steps}, lr={self.lr}, hidden={self.hidden}, "
            f"layers={self.layers}, test_samples={self.test_samples})"
        )

    def __call__(self, kl: torch.Tensor) -> torch.Tensor:
        raise TypeError("DualKL needs the batch's draws and its critics: call `term`")

    def build(self, latent_dim: int, feature_dim: int) -> Critics:
        return Critics(latent_dim, feature_dim, self.hidden, self.layers, self.lr)

    def term(self, kl: torch.Tensor, z: torch.Tensor, features: torch.Tensor, module: Critics) -> torch.Tensor:
        """Trains the critics first (in training mode), then T of the chosen critic at each z_i,
        the critic held constant: (B,)."""
        if module.training and torch.is_grad_enabled():
            module.train_steps(z, features, self.steps)
        if self.critic == "xz":
            return module.t_xz(z, features.detach(), frozen=True)
        return module.t_z(z, frozen=True)

    @property
    def text_columns(self) -> tuple[str, ...]:
        # per text, so NLL-bar and IW-NLL of one checkpoint pair by text (seqvae.analysis.estimator_gap)
        return ("nll_bar",) if self.test_samples else ()

    @torch.no_grad()
    def test_batch(self, model, batch: dict, q, features: torch.Tensor) -> dict[str, torch.Tensor] | None:
        """The reference's test estimates of one batch (SPEC §11.5), logged as test/ means over
        texts: per text S = `test_samples` posterior draws z_k and S prior draws z̃_k;
        rec_bar = mean_k CE(x, z_k); dual_kl = the ν_xz dual; nll_bar = rec_bar + dual_kl
        (reported by Fang et al. as an NLL: it is not one, see SPEC §11.5); dual_mi = dual_kl −
        the ν_z dual. Its draws come from a generator of the evaluation seed and the batch's
        first text, so a checkpoint's values do not depend on what ran before."""
        s = self.test_samples
        if not s:
            return None
        tokens, lengths = batch["tokens"], batch["lengths"]
        gen = reference_noise(model.hparams.eval_seed, batch, q.mean.device)
        z = q.sample(s, gen)  # (B, S, Z)
        prior = torch.randn(z.shape, generator=gen, device=z.device, dtype=z.dtype)
        chunk = model.iw_chunk(tokens)
        ll = [model.decoder.log_likelihood(tokens, lengths, z[:, i : i + chunk]) for i in range(0, s, chunk)]
        rec = -torch.cat(ll, 1).double().mean(1)
        critics, h = model.penalty_module, features.unsqueeze(1).expand(-1, s, -1)
        kl_xz = nwj_dual(critics.t_xz(z, h), critics.t_xz(prior, h)).double()
        kl_z = nwj_dual(critics.t_z(z), critics.t_z(prior)).double()
        values = {"nll_bar": rec + kl_xz, "rec_bar": rec, "dual_kl": kl_xz, "dual_kl_z": kl_z, "dual_mi": kl_xz - kl_z}
        sync = model.trainer.world_size > 1
        for name, v in values.items():
            model.log(f"test/{name}", v.mean().float(), batch_size=v.numel(), sync_dist=sync)
        if hasattr(q, "L"):  # SPEC §11.1: how far L is from singular (the exact KL grows without bound there)
            sigma_min = torch.linalg.svdvals(q.L.double()).min().float()
            model.log("test/sigma_min_L", sigma_min, batch_size=v.numel(), sync_dist=sync)
        return {"nll_bar": values["nll_bar"]}


def reference_noise(eval_seed: int, batch: dict, device) -> torch.Generator:
    """The reference estimates' noise for one batch: seeded from the evaluation seed and the
    dataset position of the batch's first text (the same batch, the same draws, on any rank)."""
    index = batch.get("index")
    first = int(index.reshape(-1)[0]) if index is not None else 0
    seed = np.random.SeedSequence([eval_seed, TEST_NOISE_STREAM, first]).generate_state(1, dtype=np.uint64)[0] >> 1
    return torch.Generator(device=device).manual_seed(int(seed))


__all__ = ["Critics", "DualKL", "critic_net", "nwj_dual"]
