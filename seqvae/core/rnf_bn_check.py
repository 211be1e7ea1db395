"""WAE-RNF's BatchNorm heads, checked at every validation and test (`RNFHeadsCheck`, an
`eval_checks.EvalCheck` that `PlanarFlowPosterior(batch_norm=True)` declares).

With `batch_norm` (as the reference's encoder has it) each posterior head (mu, log σ²) is
batch-normalised: in training by each batch's own mean and variance, at evaluation by the running
ones. A training batch's normalised values therefore sit at a root-mean-square distance of
√(v/(v+ε)) ≤ 1 from their mean, in every dimension. At evaluation the texts sit at
RMS = √(E[(x − running mean)²] / (running var + ε)) from the running mean; where that is far above
1, evaluation spreads the heads' outputs further than training ever did, and through exp(log σ²)
a few running s.d. become a KL of hundreds of nats, an AU that counts BatchNorm and an IW-NLL of
a posterior training never produced. It happens when training's batches see less spread than the
evaluation texts have: seqvae's `data.batching: bucket` batches hold texts of one length, and
issue 48's yelp10k seed 1 had the heads' pre-BN values varying ~800 times more across lengths
than within one (docs/metrics.md, "WAE-RNF's BatchNorm heads at evaluation").

THRESHOLD = 3 running s.d.: random batches of B texts give an RMS of about √(1 + 1/B) at
evaluation (the batch means' own scatter), so 3 leaves room for any batch size and flags only a
spread training never saw, about 9 times its variance. The figures behind it (medians over
dimensions from `scripts/rnf_bn_heads.py` on checkpoints no longer kept, not this record):
yelp10k seed 1's epoch-19 checkpoint, whose validation KL read 275 against 0.14 under the
batches' own statistics: mean head √(4.1e-4 / (2.2e-8 + 1e-5)) ≈ 6.4, log σ² head
√(7.6e-5 / (1.2e-8 + 1e-5)) ≈ 2.8, texts up to 492 and 247 running s.d. off; seeds 2 and 3, which
read the same either way: ≈ √(0.118 / 0.113) ≈ 1.0 and √(2.0e-3 / 1.5e-3) ≈ 1.2 if their running
variances are the within-length variances (not recorded).
"""

from __future__ import annotations

import torch

from seqvae.core.eval_checks import PREFIX, EvalCheck, number

THRESHOLD = 3.0  # running s.d. (root mean square) from the running mean: training's batches sit at ≤ 1
HEADS = ("mu", "logvar")
SHOWN_DIMS = 6  # indices the warning line names per head (metrics.json lists all)
TITLE = "WAE-RNF's BatchNorm heads evaluated unlike training"
CONSEQUENCE = (
    "their KL, AU, MI, IW-NLL, PPL, −ELBO and μ erank read the heads' running statistics, not what training saw "
    f"(texts more than {THRESHOLD:g} running s.d. from the running mean)"
)


def head_norms(model) -> dict[str, torch.nn.BatchNorm1d] | None:
    layer = getattr(getattr(model, "encoder", None), "to_posterior", None)
    norms = {h: getattr(layer, f"{h}_norm", None) for h in HEADS}
    return None if any(n is None for n in norms.values()) else norms


def rms_from_running_mean(n: int, mean: torch.Tensor, var: torch.Tensor, bn: torch.nn.BatchNorm1d) -> torch.Tensor:
    """Per dimension, √(mean over the n texts of (x − running mean)²) / √(running var + ε), from
    the texts' mean and variance (divisor n − 1)."""
    second = var * (n - 1) / n + (mean - bn.running_mean.detach().double()) ** 2
    return (second / (bn.running_var.detach().double() + bn.eps)).sqrt()


def heads_record(moments: dict, norms: dict[str, torch.nn.BatchNorm1d], stage: str, epoch: int) -> dict:
    """What metrics.json says (`rnf_bn_heads`): per head, the dimensions whose texts sit more than
    THRESHOLD running s.d. from the running mean, the largest and the median such distance."""
    dims, largest, median = {}, {}, {}
    for head in HEADS:
        n, mean, var = moments[head]
        rms = rms_from_running_mean(n, mean, var, norms[head])
        dims[head] = (rms > THRESHOLD).nonzero().flatten().tolist()
        largest[head], median[head] = number(rms.max().item()), number(rms.median().item())
    return {
        "broken": any(dims.values()),
        "dims": dims,
        "latent_dim": int(moments["mu"][1].numel()),
        "max_rms_running_sd": largest,
        "median_rms_running_sd": median,
        "threshold": THRESHOLD,
        "eps": float(norms["mu"].eps),
        "texts": moments["mu"][0],
        "stage": stage,
        "epoch": epoch if stage == "val" else None,  # a test's trainer may not know its checkpoint's epoch
        "title": TITLE,
        "consequence": CONSEQUENCE,
    }


def shown(dims: list[int]) -> str:
    return ", ".join(map(str, dims[:SHOWN_DIMS])) + (", …" if len(dims) > SHOWN_DIMS else "")


def warning_line(r: dict, bucketed: bool) -> str:
    names = {"mu": "mean", "logvar": "log σ²"}
    where = " and the ".join(f"{names[h]} head ({len(d)}: {shown(d)})" for h, d in r["dims"].items() if d)
    largest = max(v for v in r["max_rms_running_sd"].values() if v is not None)
    texts = f"{r['texts']} {'test' if r['stage'] == 'test' else 'validation'} texts"
    why = (
        " (data.batching: bucket trains on batches of one length, whose statistics miss the spread across lengths)"
        if bucketed
        else ""
    )
    return (
        f"{PREFIX}WAE-RNF's BatchNorm heads are evaluated unlike in training at {EvalCheck.where(r)}: the {texts} sit "
        f"more than {THRESHOLD:g} running s.d. (root mean square, up to {largest:.3g}) from the running mean in dimensions "
        f"of the {where} (of {r['latent_dim']} per head), where training's batches sit within 1{why}; KL, AU, MI and "
        "IW-NLL of this run read the heads' running statistics, not what training saw: `python scripts/rnf_bn_heads.py RUN_DIR` "
        "gives both readings (docs/metrics.md; metrics.json: rnf_bn_heads)"
    )


class RNFHeadsCheck(EvalCheck):
    """The heads' BatchNorm at evaluation (the module's docstring); metrics.json `rnf_bn_heads`.
    Applies to a model whose posterior layer has BatchNorm on both heads (WAE-RNF's `batch_norm`)."""

    key = "rnf_bn_heads"

    def __init__(self):
        super().__init__()
        self._bucketed = False  # the fit's batches were of one length (said in the warning)

    @staticmethod
    def applies(model) -> bool:
        return head_norms(model) is not None

    def norms(self, pl_module) -> dict[str, torch.nn.BatchNorm1d]:
        return head_norms(pl_module)

    def record(self, trainer, pl_module, moments, stage: str) -> dict:
        self._bucketed = getattr(getattr(trainer, "datamodule", None), "hparams", {}).get("batching") == "bucket"
        return heads_record(moments, head_norms(pl_module), stage, trainer.current_epoch)

    def warning_line(self, record: dict) -> str:
        return warning_line(record, self._bucketed)
