"""WAE-RNF's posterior (Wang & Wang 2019; ../shared/SPEC.md §12): a diagonal Gaussian q0(z0|x)
pushed through K planar layers with GLOBAL parameters (not functions of x), z_K = f_K ∘ … ∘ f_1(z0).
The decoder reads z_K wherever it reads z; the prior N(0, I) is evaluated at z_K, and

    log q_K(z_K|x) = log q0(z0|x) − S(z0),   S(z0) = Σ_k log|det ∂f_k/∂z (z_{k−1})|   (exact).

`PlanarFlowPosterior` is the `model.posterior` strategy (its layer: the heads, the flow, and the
optional per-head BatchNorm the reference has); `PlanarFlowGaussian` its batch object (the interface
of `gaussian.DiagonalGaussian`). The training-only terms (MMD on pre-flow samples, the centres
penalty) are in `wae_rnf.py`; the reference's defective IW-NLL, kept only as a diagnostic, in
`rnf_diagnostics.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from seqvae.core.gaussian import DiagonalGaussian, log_standard_normal
from seqvae.core.posteriors import Posterior
from seqvae.core.rnf_bn_check import RNFHeadsCheck
from seqvae.core.wae_rnf import CentresPenalty, MMDPenalty
from seqvae.options import NON_NEGATIVE, check_strategy


def planar_u_hat(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """û = u + (m(wᵀu) − wᵀu)·w/‖w‖², m(a) = −1 + log(1 + eᵃ): wᵀû = m(wᵀu) > −1, which makes
    each layer invertible with a positive Jacobian determinant (Rezende & Mohamed 2015, A.1).
    u, w (K, Z) for K layers -> (K, Z)."""
    wu = (w * u).sum(-1, keepdim=True)
    return u + (F.softplus(wu) - 1 - wu) * w / w.pow(2).sum(-1, keepdim=True)


class PlanarFlow(nn.Module):
    """K planar layers f(z) = z + û·tanh(wᵀz + b) shared by every text; `centres` (C, Z): the
    points the centres penalty measures each layer's input against (`wae_rnf.CentresPenalty`), or
    None. Initialised as the reference: u, w ~ N(0, I), b = 1 (`init_own_parameters`, which
    `networks.init_weights` calls after its own scheme)."""

    def __init__(self, latent_dim: int, flows: int, centres: torch.Tensor | None = None):
        super().__init__()
        self.u = nn.Parameter(torch.empty(flows, latent_dim))
        self.w = nn.Parameter(torch.empty(flows, latent_dim))
        self.b = nn.Parameter(torch.empty(flows))
        self.register_buffer("centres", centres)
        self.init_own_parameters()

    def init_own_parameters(self) -> None:
        with torch.no_grad():
            self.u.normal_()
            self.w.normal_()
            self.b.fill_(1.0)

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """z0 (..., Z) -> z_K (..., Z), S(z0) (...) and each layer's input z_{k−1} (K of (..., Z)).
        log|det| = log(1 + (1 − tanh²(wᵀz + b))·wᵀû), by log1p: 1 + … > 0 under the constraint, so
        no ε inside the log (the reference adds 1e-8). With no layers: z, zeros, []."""
        u_hat = planar_u_hat(self.u, self.w).to(z.dtype)
        w, b = self.w.to(z.dtype), self.b.to(z.dtype)
        log_det = torch.zeros(z.shape[:-1], dtype=z.dtype, device=z.device)
        inputs = []
        for k in range(w.size(0)):
            inputs.append(z)
            t = torch.tanh(z @ w[k] + b[k])
            z = z + t.unsqueeze(-1) * u_hat[k]
            log_det = log_det + torch.log1p((1 - t * t) * (w[k] @ u_hat[k]))
        return z, log_det, inputs


def _batch_norm(norm: nn.BatchNorm1d, x: torch.Tensor) -> torch.Tensor:
    """A one-text training batch (equal-length buckets make some) has no batch variance: it is
    normalised with the running statistics, which it leaves unchanged, as at evaluation."""
    if norm.training and x.size(0) == 1:
        return F.batch_norm(x, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0, norm.eps)
    return norm(x)


class PlanarFlowLayer(nn.Linear):
    """The heads H -> 2Z (mu, log σ²) as a Linear (bias-free, as `GaussianPosterior`'s, unless
    `batch_norm`), then, with `batch_norm`, an affine BatchNorm1d on EACH head (the reference's
    encoder: bias and BN on both), and the flow (`self.flow`)."""

    def __init__(self, feature_dim: int, latent_dim: int, flows: int, batch_norm: bool, centres: torch.Tensor | None):
        super().__init__(feature_dim, 2 * latent_dim, bias=batch_norm)
        self.mu_norm = nn.BatchNorm1d(latent_dim) if batch_norm else None
        self.logvar_norm = nn.BatchNorm1d(latent_dim) if batch_norm else None
        self.flow = PlanarFlow(latent_dim, flows, centres)

    def init_own_parameters(self) -> None:
        """The BatchNorms' PyTorch defaults (weight 1, bias 0), whatever `init` did to them."""
        for norm in (self.mu_norm, self.logvar_norm):
            if norm is not None:
                norm.reset_parameters()

    def base(self, h: torch.Tensor) -> DiagonalGaussian:
        mu, logvar = super().forward(h).float().chunk(2, dim=-1)
        if self.mu_norm is not None:
            mu, logvar = _batch_norm(self.mu_norm, mu), _batch_norm(self.logvar_norm, logvar)
        return DiagonalGaussian(mu, logvar)


class PlanarFlowPosterior(Posterior):
    """WAE-RNF's posterior (SPEC §12.2): N(mu(x), diag σ²(x)) through `flows` planar layers with
    global parameters. With 0 flows and no BatchNorm it is `GaussianPosterior` bit for bit (same
    layer, same draws, log q, KL, IW-NLL). Its KL is not a sum over dimensions (the flow couples
    them): the free-bits penalties are refused with it; BN-VAE (model.bn_gamma) too.

    Args:
        flows: K, the planar layers (the reference: 1 on Yahoo and Yelp, 3 on PTB).
        batch_norm: Bias and an affine BatchNorm1d on both heads, as the reference's encoder.
        mmd: The MMD penalty on pre-flow samples (`wae_rnf.MMDPenalty`); None: off.
        centres: The centres penalty at each layer's input (`wae_rnf.CentresPenalty`); None: off.
        unweighted_log_det: The reference's objective: −S enters the loss with weight 1 while the
            rest of the KL has the schedule's weight w (adds −(1 − w)·S̄); False: w·KL(q_K‖p), a β-ELBO.
    """

    per_dimension_kl = False
    bn_vae = False  # its `mean` is f(mu), after the flow: use its own BatchNorm option (batch_norm)
    checks = (RNFHeadsCheck,)  # with batch_norm: the heads' BatchNorm at evaluation against training's
    option_ranges = {"flows": NON_NEGATIVE}

    def __init__(
        self,
        flows: int = 1,
        batch_norm: bool = False,
        mmd: MMDPenalty | None = None,
        centres: CentresPenalty | None = None,
        unweighted_log_det: bool = False,
    ):
        self.flows, self.batch_norm, self.mmd, self.centres = flows, batch_norm, mmd, centres
        self.unweighted_log_det = unweighted_log_det

    def layer(self, feature_dim: int, latent_dim: int) -> PlanarFlowLayer:
        check_strategy("model.posterior", self)  # here, not in __init__: jsonargparse would wrap the error
        for name, penalty in (("mmd", self.mmd), ("centres", self.centres)):
            if penalty is not None:
                check_strategy(f"model.posterior.init_args.{name}", penalty)
        centres = self.centres.make(latent_dim) if self.centres is not None else None
        return PlanarFlowLayer(feature_dim, latent_dim, self.flows, self.batch_norm, centres)

    def distribution(self, layer: PlanarFlowLayer, h: torch.Tensor) -> PlanarFlowGaussian:
        return PlanarFlowGaussian(layer.base(h), layer.flow)

    def training_terms(self, q: PlanarFlowGaussian, kl_weight: float) -> dict[str, torch.Tensor]:
        """The loss terms besides rec + w·KL, on the draw the reconstruction used (`q.drawn`)."""
        terms = {}
        if self.mmd is not None:  # weight mmd.weight − w, as the reference (10 → 9.2)
            terms["mmd"] = (self.mmd.weight - kl_weight) * self.mmd(q.base.sample(1)[:, 0])
        drawn = q.last_draw()
        if self.centres is not None and drawn.inputs:
            terms["centres"] = self.centres(drawn.inputs, q.flow.centres).mean()
        if self.unweighted_log_det:
            terms["log_det"] = -(1 - kl_weight) * drawn.log_det.mean()
        return terms


class FlowDraw:
    """One draw: z0 (B, K, Z), z_K, S(z0) (B, K) and each layer's input."""

    def __init__(self, z0, zk, log_det, inputs):
        self.z0, self.zk, self.log_det, self.inputs = z0, zk, log_det, inputs


class PlanarFlowGaussian:
    """q_K(z|x) for a batch: `base` (the DiagonalGaussian q0, before the flow) and the shared
    `flow`. The interface of `gaussian.DiagonalGaussian`, with these meanings:
    - `sample(k)`: z_K, and the draw is kept (`last_draw`): `kl()` is the Monte-Carlo KL on it
      (the sample the reconstruction used, in training and evaluation alike);
    - `draw(k)`: z_K and log q_K(z_K|x) = log q0(z0|x) − S(z0) (IW-NLL's weights; nothing kept);
    - `mean`: f(mu), the code the decoder reads at the posterior's centre (generation);
    - `base`: what AU and MI measure (SPEC §12.6): the flow is one bijection for all texts, so
      log q_K(z_i|x_j) = log q0(z0_i|x_j) − S(z0_i), S cancels and MI(q_K) = MI(q0) on z0; AU is
      counted on the base means, comparable with the other rows;
    - `params()`: the base's (mu, log σ²)."""

    per_dimension_kl = False
    shared_params: tuple[int, ...] = ()  # the base's parameters are per text

    def __init__(self, base: DiagonalGaussian, flow: PlanarFlow):
        self.base, self.flow = base, flow
        self._drawn: FlowDraw | None = None

    @property
    def mean(self) -> torch.Tensor:
        return self.flow(self.base.mu)[0]

    def params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.base.params()

    def _flow_draw(self, k: int, generator=None) -> FlowDraw:
        z0 = self.base.sample(k, generator)
        return FlowDraw(z0, *self.flow(z0))

    def sample(self, k: int, generator=None) -> torch.Tensor:
        self._drawn = self._flow_draw(k, generator)
        return self._drawn.zk

    def draw(self, k: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
        d = self._flow_draw(k, generator)
        return d.zk, self.base.log_prob(d.z0) - d.log_det

    def last_draw(self) -> FlowDraw:
        if self._drawn is None:
            raise RuntimeError("PlanarFlowGaussian: kl() and the training terms use the last sample(); draw one first")
        return self._drawn

    def kl(self) -> torch.Tensor:
        """KL(q_K ‖ N(0, I)) per text, (B,): KL(q0 ‖ p) in closed form plus the Monte-Carlo mean of
        log p(z0) − log p(z_K) − S(z0) over the last sample (log q_K − log p = log q0 − log p(z0) +
        that). Unbiased; exactly the closed form with no layers (the difference is then 0)."""
        d = self.last_draw()
        return self.base.kl() + (log_standard_normal(d.z0) - log_standard_normal(d.zk) - d.log_det).mean(1)

    def kl_terms(self) -> torch.Tensor:
        return self.kl().unsqueeze(-1)  # (B, 1): one term, not one per dimension


__all__ = ["PlanarFlow", "PlanarFlowGaussian", "PlanarFlowPosterior", "planar_u_hat"]
