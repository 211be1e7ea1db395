"""Annealed importance sampling (AIS) of log p(x) for the decoder (SPEC §14; Neal 2001, Wu et al.
2017): `seqvae test --ckpt_path C --model.ais seqvae.AIS` adds `ais_nll` to metrics.json and
per_text.csv beside the IW-NLL.

The path runs from the prior to the posterior, f_t(z) = N(z; 0, I) · p(x|z)^t, over a linear
schedule 0 = t_0 < … < t_{T-1} = 1; each of K chains per text starts from an exact prior draw,
adds (t_j − t_{j−1}) · log p(x|z) to its log-weight, then takes one HMC transition that leaves
f_{t_j} invariant (L leapfrog steps, a Metropolis test, the step size adapted per chain towards
an acceptance rate). log p̂(x) = logsumexp_k log w_k − log K: E[p̂] = p(x), so −log p̂ is an upper
bound on the NLL in expectation, as the IW-NLL is (which it equals with T = 2 points and the same
draws), tighter as T and K grow (the step-size adaptation aside: docs/ais.md).

Not He et al.'s copy (`eval_ais/hmc.py`): there the momentum is scaled in place inside the
position update, so it shrinks by ε at every step and the kernel does not leave f_t invariant
(SPEC §14.5; `tests/test_ais.py` shows such a kernel failing the invariance check).

Cost: the gradient at the chain's current position is carried over from the transition that
put it there (same z, same decoder: the same value), so a transition evaluates L gradients, not
L + 1 (SPEC §14.4 counts L + 1): K · (1 + (T − 1) · L) decoder forward+backward passes per text,
and no forward-only passes (log p(x|z) comes with each gradient). The HMC state (z, momentum,
log-weights, energies) is float64; the decoder runs in its own dtype.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from seqvae.core.metrics import iw_nll_from_weights, iw_nll_standard_error
from seqvae.options import AT_LEAST_ONE, POSITIVE, Range, check_strategy
from seqvae.store.strategies import strategy

# z (B, K, Z) float64 -> (log p(x|z) (B, K), its gradient in z (B, K, Z)), both float64
LogLikelihoodGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
F64 = torch.float64


def linear_schedule(points: int, device=None) -> torch.Tensor:
    """t_0 = 0 < … < t_{points−1} = 1, evenly spaced (float64)."""
    return torch.linspace(0.0, 1.0, points, dtype=F64, device=device)


def leapfrog(
    z: torch.Tensor, v: torch.Tensor, grad_ll: torch.Tensor, t: float, eps: torch.Tensor, steps: int, ll_grad: LogLikelihoodGrad
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`steps` leapfrog steps of size `eps` (per chain, (B, K, 1)) on U(z) = ½‖z‖² − t · log p(x|z),
    then the momentum negated (so that the map is its own inverse). `grad_ll` is ∇ log p(x|z) at
    `z`; returns (z', v', log p(x|z'), ∇ log p(x|z')), `steps` gradient evaluations. Each step
    updates a new momentum tensor: the in-place scaling of He et al.'s copy is the defect this avoids."""
    v = v - 0.5 * eps * (z - t * grad_ll)
    ll = None
    for i in range(steps):
        z = z + eps * v
        ll, grad_ll = ll_grad(z)
        v = v - (eps if i < steps - 1 else 0.5 * eps) * (z - t * grad_ll)
    return z, -v, ll, grad_ll


def hmc_transition(
    z: torch.Tensor,
    ll: torch.Tensor,
    grad_ll: torch.Tensor,
    t: float,
    eps: torch.Tensor,
    steps: int,
    ll_grad: LogLikelihoodGrad,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One HMC transition per chain leaving f_t(z) ∝ N(z; 0, I) p(x|z)^t invariant: momentum
    v ~ N(0, I), leapfrog, accept with probability min(1, exp(H − H')), H = U + ½‖v‖² (a proposal
    whose energy is not finite is rejected). Returns (z, log p(x|z), ∇, accepted (B, K) bool)."""
    v = torch.randn(z.shape, generator=generator, dtype=z.dtype, device=z.device)
    z_new, v_new, ll_new, grad_new = leapfrog(z, v, grad_ll, t, eps, steps, ll_grad)
    h_old = 0.5 * (z * z).sum(-1) - t * ll + 0.5 * (v * v).sum(-1)
    h_new = 0.5 * (z_new * z_new).sum(-1) - t * ll_new + 0.5 * (v_new * v_new).sum(-1)
    log_u = torch.rand(ll.shape, generator=generator, dtype=ll.dtype, device=ll.device).log()
    accept = log_u < h_old - h_new  # NaN compares False: rejected
    keep = accept.unsqueeze(-1)
    return torch.where(keep, z_new, z), torch.where(accept, ll_new, ll), torch.where(keep, grad_new, grad_ll), accept


def ais_log_weights(
    ll_grad: LogLikelihoodGrad,
    z0: torch.Tensor,
    schedule: torch.Tensor,
    generator: torch.Generator | None = None,
    leapfrog_steps: int = 10,
    step_size: float = 0.01,
    target_accept: float = 0.65,
    step_range: tuple[float, float] = (1e-4, 0.5),
    progress: Callable[[float], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chains' AIS log-weights (B, K) from prior draws `z0` (B, K, Z) along `schedule` (T,),
    and each chain's acceptance rate (B, K). After each transition j a chain's step size is
    multiplied by 1.02 if its acceptance rate so far exceeds `target_accept`, else by 0.98, and
    clamped to `step_range` (SPEC §14.2). `progress(share)` is called after each transition."""
    z = z0.to(F64)
    ll, grad_ll = ll_grad(z)
    log_w = torch.zeros_like(ll)
    accepted = torch.zeros_like(ll)
    eps = torch.full((*ll.shape, 1), step_size, dtype=F64, device=z.device)
    transitions = schedule.numel() - 1
    times = schedule.tolist()  # Python floats: no host read per transition
    for j in range(1, transitions + 1):
        log_w = log_w + (times[j] - times[j - 1]) * ll  # the weight before the move
        z, ll, grad_ll, accept = hmc_transition(z, ll, grad_ll, times[j], eps, leapfrog_steps, ll_grad, generator)
        accepted = accepted + accept
        grow = (accepted / j > target_accept).unsqueeze(-1)
        eps = torch.where(grow, eps * 1.02, eps * 0.98).clamp(*step_range)
        if progress is not None:
            progress(j / transitions)
    return log_w, accepted / max(transitions, 1)


def decoder_ll_grad(decoder, tokens: torch.Tensor, lengths: torch.Tensor) -> LogLikelihoodGrad:
    """log p(x|z) and its gradient in z from `decoder` (a `LSTMDecoder`, in eval mode: no dropout)
    for the texts `tokens` (B, T), each with K z's (B, K, Z)."""
    dtype = next(decoder.parameters()).dtype

    def ll_grad(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zd = z.detach().to(dtype).requires_grad_(True)
        ll = decoder.log_likelihood(tokens, lengths, zd, summed=True)  # `summed`: the gradient of a sum
        (grad,) = torch.autograd.grad(ll.sum(), zd)
        return ll.detach().to(F64), grad.to(F64)

    return ll_grad


class _WeightsFrozen:
    """The decoder's weights out of autograd while AIS differentiates in z only (half the backward)."""

    def __init__(self, module: torch.nn.Module):
        self.params = [p for p in module.parameters() if p.requires_grad]

    def __enter__(self):
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p in self.params:
            p.requires_grad_(True)


@strategy
class AIS:
    """AIS estimate of log p(x) at test (`model.ais`; SPEC §14), reported as `ais_nll` (nats per
    text; `ais_ppl`, `ais_nll_se`, `ais_accept`, `ais_seconds_per_text` in metrics.json).

    Args:
        points: Schedule points T (t from 0 to 1, linear): T − 1 transitions. 500 in He et al.'s config.
        chains: Independent chains K per text (3 in He et al.'s config); its s.e. needs K ≥ 2.
        leapfrog: Leapfrog steps L per HMC transition (10).
        step_size: Initial leapfrog step size ε (0.01), adapted per chain.
        target_accept: The acceptance rate the step size is adapted towards (0.65).
    """

    option_ranges = {
        "points": Range(lambda v: v >= 2, ">= 2"),
        "chains": AT_LEAST_ONE,
        "leapfrog": AT_LEAST_ONE,
        "step_size": POSITIVE,
        "target_accept": Range(lambda v: 0 < v < 1, "in (0, 1)"),
    }

    def __init__(
        self, points: int = 500, chains: int = 3, leapfrog: int = 10, step_size: float = 0.01, target_accept: float = 0.65
    ):
        self.points, self.chains, self.leapfrog = points, chains, leapfrog
        self.step_size, self.target_accept = step_size, target_accept
        check_strategy("model.ais", self)  # the Python API's check (the CLI's comes before, `check_parsed`)

    def gradient_evaluations(self) -> int:
        """Decoder forward+backward passes per text: K · (1 + (T − 1) · L)."""
        return self.chains * (1 + (self.points - 1) * self.leapfrog)

    def passes_per_text(self) -> int:
        """The test progress line's work unit: a forward+backward pass counted as 3 forward passes."""
        return 3 * self.gradient_evaluations()

    def log_weights(self, ll_grad: LogLikelihoodGrad, shape: tuple[int, int, int], device, generator, progress=None):
        """(log w (B, K), acceptance rates (B, K)) for B texts of `shape` (B, K, Z), prior draws from `generator`."""
        z0 = torch.randn(shape, generator=generator, dtype=F64, device=device)
        schedule = linear_schedule(self.points, device)
        return ais_log_weights(
            ll_grad, z0, schedule, generator, self.leapfrog, self.step_size, self.target_accept, progress=progress
        )

    def estimate(self, decoder, tokens: torch.Tensor, lengths: torch.Tensor, latent_dim: int, generator, progress=None) -> dict:
        """Per text: `nll` = −log p̂(x), `se` its Monte-Carlo s.e. across the K chains (delta
        method, as the IW-NLL's; NaN for K = 1), `accept` the chains' mean acceptance rate; and
        `seconds`, the wall time of the batch. Runs with gradients on inside the test loop's
        inference mode."""
        start = time.perf_counter()
        with torch.inference_mode(False), torch.enable_grad(), _WeightsFrozen(decoder):
            tokens, lengths = tokens.clone(), lengths.clone()  # not inference tensors: autograd saves them
            ll_grad = decoder_ll_grad(decoder, tokens, lengths)
            shape = (tokens.size(0), self.chains, latent_dim)
            log_w, accept = self.log_weights(ll_grad, shape, tokens.device, generator, progress)
        if tokens.is_cuda:
            torch.cuda.synchronize(tokens.device)  # the seconds are the batch's, not its launch's
        nll, se = iw_nll_from_weights(log_w), iw_nll_standard_error(log_w)
        return {"nll": nll, "se": se, "accept": accept.mean(1), "seconds": time.perf_counter() - start}


def exact_decoder_nll(nll: torch.Tensor) -> dict:
    """AIS of a model without z (the language model): the exact NLL, s.e. 0, nothing run."""
    zero = torch.zeros_like(nll)
    return {"nll": nll, "se": zero, "accept": torch.full_like(nll, math.nan), "seconds": 0.0}
