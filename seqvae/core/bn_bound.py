"""BN-VAE's bound, checked at every validation and test (`BNBoundCheck`, an `eval_checks.EvalCheck`).

BN-VAE batch-normalises the posterior means with a fixed scale γ: with v the batch variance of
the raw (pre-BN) means of a dimension, E_batch[mu_d²] = γ²·v/(v+ε) + β_d², so E[KL] ≥ Z·γ²/2 only
while v ≫ ε (`networks.LSTMEncoder`). An encoder can escape the bound by making its raw means
nearly constant; then evaluation, which divides by the running variance + ε, no longer maps the
means to a spread of γ either, and a small drift of their mean from the running mean puts every
text's mean several prior standard deviations off: a KL of hundreds of nats, a huge IW-NLL, and
AU = Z, which reads as an encoder that encodes. The check measures, per latent dimension, the
variance of the raw means over the evaluation texts and BatchNorm's running variance (the
training batches' variance), and calls the bound broken where either is below THRESHOLD·ε.

THRESHOLD = 10: at v = 10·ε the bound keeps γ²·10/11 ≈ 91% of its value and eval-mode BatchNorm
divides by √(v+ε) ≈ 1.05·√v, i.e. both still do what BN-VAE claims to within 10%; at v = ε half
of the bound is gone, and below it fades as v/ε. A healthy encoder's raw means vary by far more
(the demo config after 2 epochs: variance ≥ 0.03 in every dimension), so the margin costs no
false alarms.
"""

from __future__ import annotations

import torch

from seqvae.core.eval_checks import PREFIX, EvalCheck, number

THRESHOLD = 10.0  # the bound counts as broken where a variance is below THRESHOLD·ε (see above)
SHOWN_DIMS = 8  # indices the warning line names (metrics.json lists all)
TITLE = "BN-VAE bound broken"  # compare's footnote (`eval_checks.py`)
CONSEQUENCE = (
    "their KL, AU, MI, IW-NLL, PPL, −ELBO and μ erank are not BN-VAE's (raw means vary by less than 10·bn_eps)"
)


def mean_norm(pl_module) -> torch.nn.BatchNorm1d | None:
    encoder = getattr(pl_module, "encoder", None)
    return getattr(encoder, "mean_norm", None)


def bound_record(n: int, mean: torch.Tensor, var: torch.Tensor, bn: torch.nn.BatchNorm1d, stage: str, epoch: int) -> dict:
    """What metrics.json says (`bn_bound`): broken, the dimensions below THRESHOLD·ε, the smallest
    variances, and how far eval-mode BatchNorm moves the texts' average mean from β, in prior s.d."""
    running_var = bn.running_var.detach().double()
    eps, gamma = float(bn.eps), bn.weight.detach().double()
    limit = THRESHOLD * eps
    low = (var < limit) | (running_var < limit)
    shift = (gamma * (mean - bn.running_mean.detach().double()) / (running_var + eps).sqrt()).abs()
    dims = low.nonzero().flatten().tolist()
    return {
        "broken": bool(dims),
        "dims": dims,
        "latent_dim": int(var.numel()),
        "min_raw_var": number(var.min().item()),
        "min_running_var": number(running_var.min().item()),
        "eps": eps,
        "threshold": limit,
        "max_eval_shift": number(shift.max().item()),
        "texts": n,
        "stage": stage,
        "epoch": epoch if stage == "val" else None,  # a test's trainer may not know its checkpoint's epoch
        "title": TITLE,
        "consequence": CONSEQUENCE,
    }


def warning_line(r: dict) -> str:
    dims = r["dims"]
    shown = ", ".join(map(str, dims[:SHOWN_DIMS])) + (", …" if len(dims) > SHOWN_DIMS else "")
    texts = f"{r['texts']} {'test' if r['stage'] == 'test' else 'validation'} texts"
    shift = r["max_eval_shift"] or 0.0
    # said when it matters: a mean one prior s.d. off costs ½ nat of KL in that dimension for every text
    moved = f" and eval-mode BatchNorm moves the texts' mean up to {shift:.2g} prior s.d. off β" if shift >= 1 else ""
    return (
        f"{PREFIX}BN-VAE's bound does not hold at {EvalCheck.where(r)}: in {len(dims)} of {r['latent_dim']} latent dimensions "
        f"({shown}) the raw posterior means vary by less than {THRESHOLD:g}·bn_eps (variance down to "
        f"{r['min_raw_var']:.2g} over the {texts}, running variance down to {r['min_running_var']:.2g}; "
        f"bn_eps = {r['eps']:.2g}), so KL ≥ Z·γ²/2 is not guaranteed{moved}; KL, AU, MI and IW-NLL of this run are "
        "not BN-VAE's: lower model.bn_eps well below that variance (e.g. 1e-10) and train again (metrics.json: bn_bound)"
    )


class BNBoundCheck(EvalCheck):
    """BN-VAE's bound (the module's docstring), measured on the raw means the encoder's `mean_norm`
    sees; metrics.json `bn_bound`. Applies to a model with BN-VAE (model.bn_gamma)."""

    key = "bn_bound"

    @staticmethod
    def applies(model) -> bool:
        return mean_norm(model) is not None

    def norms(self, pl_module) -> dict[str, torch.nn.BatchNorm1d]:
        return {"mean": mean_norm(pl_module)}

    def record(self, trainer, pl_module, moments, stage: str) -> dict:
        n, mean, var = moments["mean"]
        return bound_record(n, mean, var, mean_norm(pl_module), stage, trainer.current_epoch)

    def warning_line(self, record: dict) -> str:
        return warning_line(record)
