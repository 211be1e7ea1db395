"""The TensorBoard image of the latent dimensions (`callbacks.LatentDimensions`)."""

from __future__ import annotations

import math


def latent_figure(var_mu, kl, threshold: float = 0.01, title: str = ""):
    """What AU counts, per latent dimension (sorted by Var_x(E[z_d]), largest first): the
    variance of the posterior mean over texts (log axis; the dashed line is AU's threshold) and
    the mean KL of that dimension. A collapsed model has every bar below the line and KL ≈ 0."""
    from matplotlib.figure import Figure

    var_mu, kl = [float(v) for v in var_mu], [float(v) for v in kl]
    order = sorted(range(len(var_mu)), key=lambda d: -var_mu[d] if math.isfinite(var_mu[d]) else math.inf)
    xs = list(range(len(order)))
    fig = Figure(figsize=(max(6.0, 0.25 * len(order) + 2), 5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    active = sum(var_mu[d] >= threshold for d in order)
    top.bar(xs, [max(var_mu[d], 1e-12) for d in order], color=["C0" if var_mu[d] >= threshold else "C7" for d in order])
    top.set_yscale("log")
    top.axhline(threshold, color="k", linestyle="--", linewidth=1)
    top.set_ylabel("Var_x(E[z_d])")
    top.set_title(f"{title}  AU = {active} of {len(order)} (threshold {threshold:g})".strip(), fontsize="medium")
    bottom.bar(xs, [kl[d] for d in order], color="C1")
    bottom.set_ylabel("KL_d (nats)")
    bottom.set_xlabel("latent dimension d, by Var_x(E[z_d])")
    bottom.set_xticks(xs, [str(d) for d in order], fontsize="x-small")
    fig.tight_layout()
    return fig
