"""Where a WAE-RNF run's validation KL spikes come from (issue 48: yelp10k seed 1's val/kl was 3.63,
43,164.77, 4,841,685.50, 1.97 at epochs 4-7 of its curves.csv, counted from 0, while val/rec fell):
the posterior heads' BatchNorm (`PlanarFlowPosterior(batch_norm=True)`, as the reference's encoder
has it) centres and scales by its RUNNING statistics at evaluation and by each batch's own in
training; seqvae's batches are of one length (docs/metrics.md, "WAE-RNF's BatchNorm heads").

    python scripts/rnf_bn_heads.py RUN_DIR [--checkpoint last|best] [--split val|test] [--seed 0]

For the checkpoint: per head (mu, log σ²), the running variance (smallest, median) and, over the
split's texts, how far the pre-BN values sit from the running mean in running standard deviations
(the largest |x − running mean| / sqrt(running var + eps)), and their variance over the texts and within
one length (`data.batching: bucket` trains on batches of one length). Then the split's KL(q_K ‖ p) as the
model evaluates it (running statistics), split into its closed-form base term KL(q0 ‖ p) and the
flow's Monte-Carlo correction, with the largest log σ² and |mu| of any text; and the same with each
batch normalised by its own statistics (training's normalisation; the running statistics are left
as they are). A KL that is large only under the running statistics, carried by KL(q0 ‖ p) through
exp(log σ²), is the BatchNorm's evaluation mode, not the flow. AU (Var over texts of the base
means ≥ 0.01) under each normalisation too: the running statistics can amplify feature differences
that the batches' own statistics never saw.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from seqvae.core.gaussian import DiagonalGaussian
from seqvae.core.metrics import active_units
from seqvae.core.planar_flow import PlanarFlowGaussian, PlanarFlowPosterior
from seqvae.diagnostics import open_run, refuse


def heads(layer, h: torch.Tensor, own_batch_statistics: bool) -> DiagonalGaussian:
    """The base Gaussian q0(z0|x) of `layer` (a `PlanarFlowLayer` with batch_norm, in eval mode) for
    features h: the model's own evaluation (running statistics) or, with `own_batch_statistics`, each
    head normalised by the batch's statistics as in training (a one-text batch: running statistics,
    as training has it); the running statistics are left as they are."""
    if not own_batch_statistics or h.size(0) == 1:
        return layer.base(h)
    pre = torch.nn.Linear.forward(layer, h).float().chunk(2, dim=-1)
    norms = (layer.mu_norm, layer.logvar_norm)
    return DiagonalGaussian(*(F.batch_norm(x, None, None, n.weight, n.bias, True, 0.0, n.eps) for x, n in zip(pre, norms)))


def within_length_variance(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Per column of x (N, D): the variance within groups of texts of one length, pooled over the
    lengths that have two texts or more (weights n − 1): what an equal-length batch sees."""
    num, den = torch.zeros(x.size(1), dtype=x.dtype), 0
    for length in lengths.unique():
        group = x[lengths == length]
        if group.size(0) > 1:
            num += (group.size(0) - 1) * group.var(0)
            den += group.size(0) - 1
    return num / den if den else torch.full((x.size(1),), float("nan"), dtype=x.dtype)


def report(run: Path, checkpoint: str, split: str, seed: int) -> dict:
    model, dm = open_run(run, checkpoint, "rnf_bn_heads")
    model.eval()
    posterior = model.encoder.posterior
    if not isinstance(posterior, PlanarFlowPosterior) or not posterior.batch_norm:
        raise refuse("rnf_bn_heads", f"{run}: not a PlanarFlowPosterior with batch_norm (nothing to report)")
    layer = model.encoder.to_posterior
    dm.setup("test" if split == "test" else "validate")
    loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
    torch.manual_seed(seed)
    pre_all, lengths, mus = [], [], {"running": [], "batch": []}
    sums = {m: {"base": 0.0, "flow": 0.0, "max_text": 0.0, "max_logvar": -1e30, "max_abs_mu": 0.0} for m in mus}
    n = 0
    with torch.no_grad():
        for batch in loader:
            h = model.encoder.features(batch["tokens"], batch["lengths"])
            pre_all.append(torch.nn.Linear.forward(layer, h).double())
            lengths.append(batch["lengths"])
            for mode in ("running", "batch"):
                base = heads(layer, h, mode == "batch")
                q = PlanarFlowGaussian(base, layer.flow)
                q.sample(1)  # the draw kl() reads, as the validation step's reconstruction draws it
                kl, base_kl = q.kl().double(), base.kl().double()
                mus[mode].append(base.mu.double())
                s = sums[mode]
                s["base"] += float(base_kl.sum())
                s["flow"] += float((kl - base_kl).sum())
                s["max_text"] = max(s["max_text"], float(kl.max()))
                s["max_logvar"] = max(s["max_logvar"], float(base.logvar.max()))
                s["max_abs_mu"] = max(s["max_abs_mu"], float(base.mu.abs().max()))
            n += h.size(0)
    pre, lengths = torch.cat(pre_all).chunk(2, dim=-1), torch.cat(lengths)
    stats = {}
    for name, x, norm in zip(("mu", "logvar"), pre, (layer.mu_norm, layer.logvar_norm)):
        rv = norm.running_var
        far = ((x - norm.running_mean).abs() / (rv + norm.eps).sqrt()).max()
        stats[name] = {
            "running_var_min": float(rv.min()),
            "running_var_median": float(rv.median()),
            "pre_bn_var_over_texts_median": float(x.var(0).median()),
            "pre_bn_var_within_one_length_median": float(within_length_variance(x, lengths).median()),
            "max_running_sds_from_running_mean": float(far),
            "bn_weight_max_abs": float(norm.weight.detach().abs().max()),
        }
    for mode, s in sums.items():
        s["base"] /= n
        s["flow"] /= n
        mu = torch.cat(mus[mode])  # AU as seqvae counts it: on the base means (SPEC §12.6)
        s["au"] = int(active_units(mu.sum(0), mu.pow(2).sum(0), n))
    return {"texts": n, "heads": stats, "kl": sums}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("run", type=Path)
    p.add_argument("--checkpoint", default="last", choices=["best", "last"])
    p.add_argument("--split", default="val", choices=["val", "test"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    r = report(args.run, args.checkpoint, args.split, args.seed)
    print(f"{args.run} ({args.checkpoint}.ckpt), {args.split}: {r['texts']} texts")
    for name, s in r["heads"].items():
        print(
            f"  head {name:6s}: running var min {s['running_var_min']:.3g}, median {s['running_var_median']:.3g}; "
            f"pre-BN var over texts {s['pre_bn_var_over_texts_median']:.3g}, "
            f"within one length {s['pre_bn_var_within_one_length_median']:.3g} (median dim); "
            f"largest |x - running mean| {s['max_running_sds_from_running_mean']:.3g} running sd; "
            f"BN |weight| max {s['bn_weight_max_abs']:.3g}"
        )
    for mode, s in r["kl"].items():
        label = "running statistics (evaluation)" if mode == "running" else "each batch's own (training's)"
        print(
            f"  BN with {label:32s}: KL {s['base'] + s['flow']:.6g} = base {s['base']:.6g} + flow {s['flow']:+.4g}; "
            f"largest per text {s['max_text']:.6g}; largest log σ² {s['max_logvar']:.4g}, |mu| {s['max_abs_mu']:.4g}; "
            f"AU {s['au']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
