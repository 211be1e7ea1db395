"""WAE-RNF's BatchNorm heads, checked at every validation and test (`RNFHeadsCheck`, an
`eval_checks.EvalCheck` that `PlanarFlowPosterior(batch_norm=True)` declares).

With `batch_norm` (as the reference's encoder has it) each posterior head (mu, log σ²) is
batch-normalised: in training by each batch's own mean and variance, at evaluation by the running
ones. A training batch of two texts or more puts its normalised values at a root-mean-square
distance of √(v/(v+ε)) ≤ 1 from their mean, v its variance (a one-text batch is normalised with
the running statistics, `planar_flow._batch_norm`); the running variance rv is an average of those
v, so training's RMS in a dimension is about √(rv/(rv+ε)). At evaluation the texts sit at
RMS = √(E[(x − running mean)²] / (rv + ε)) from the running mean. Where that is several times
training's, evaluation spreads the heads' outputs further than training ever did, and through
exp(log σ²) a few running s.d. become a KL of hundreds of nats, an AU that counts BatchNorm and an
IW-NLL of a posterior training never produced. It happens when training's batches see less
spread than the evaluation texts have: seqvae's `data.batching: bucket` batches hold texts of one
length, and issue 48's yelp10k seed 1 had the heads' pre-BN values varying ~800 times more across
lengths than within one (docs/metrics.md, "WAE-RNF's BatchNorm heads at evaluation").

The rule: a dimension is flagged where RMS > max(FLOOR, RATIO·√(rv/(rv+ε))), FLOOR = 1, RATIO = 3:
the texts sit more than 3 times as far from the running mean as training's batches did, and
further than any training batch's values can (1). A BatchNorm trained on random batches reads
about 1 against a training RMS of about 1 (tests/test_rnf_bn_check.py trains one: every dimension
below 1.5), and a near-constant dimension (RMS < 1) is left alone whatever the ratio: its outputs
stay within what training produced. At yelp10k seed 1's epoch-19 checkpoint (figures in
docs/metrics.md: median variances over dimensions about the texts' own mean, without the offset
term, so estimates of RMS): mean head √(4.1e-4 / (2.2e-8 + 1e-5)) ≈ 6.4 against a training RMS of
√(2.2e-8 / 1.0022e-5) ≈ 0.05, log σ² head ≈ 2.8 against ≈ 0.03: both flagged.
"""

from __future__ import annotations

import torch

from seqvae.core.eval_checks import PREFIX, EvalCheck, number

RATIO = 3.0  # flagged where the texts' RMS distance from the running mean is above RATIO times training's
FLOOR = 1.0  # and above FLOOR running s.d. (no training batch's values are further)
HEADS = ("mu", "logvar")
SHOWN_DIMS = 6  # indices the warning line names per head (metrics.json lists all)
TITLE = "WAE-RNF's BatchNorm heads evaluated unlike training"
CONSEQUENCE = (
    "their KL, AU, MI, IW-NLL, PPL, −ELBO and μ erank read the heads' running statistics, not what training saw "
    f"(texts over {RATIO:g} times as far from the running mean as training's batches)"
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


def training_rms(bn: torch.nn.BatchNorm1d) -> torch.Tensor:
    """Per dimension, training's RMS of the normalised values, √(rv/(rv+ε)) from the running variance."""
    rv = bn.running_var.detach().double()
    return (rv / (rv + bn.eps)).sqrt()


def median(x: torch.Tensor) -> float | None:
    return number(x.quantile(0.5).item())  # the midpoint of the two middle values when the count is even


def heads_record(moments: dict, norms: dict[str, torch.nn.BatchNorm1d], stage: str, epoch: int) -> dict:
    """What metrics.json says (`rnf_bn_heads`): per head, the dimensions flagged (the module's rule),
    the largest and the median RMS distance of the texts, and the median training RMS."""
    dims, largest, middle, training = {}, {}, {}, {}
    for head in HEADS:
        n, mean, var = moments[head]
        rms, trained = rms_from_running_mean(n, mean, var, norms[head]), training_rms(norms[head])
        dims[head] = (rms > (RATIO * trained).clamp(min=FLOOR)).nonzero().flatten().tolist()
        largest[head], middle[head], training[head] = number(rms.max().item()), median(rms), median(trained)
    return {
        "broken": any(dims.values()),
        "dims": dims,
        "latent_dim": int(moments["mu"][1].numel()),
        "max_rms_running_sd": largest,
        "median_rms_running_sd": middle,
        "median_training_rms": training,
        "ratio": RATIO,
        "floor": FLOOR,
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
        f"over {RATIO:g} times as far from the running mean as training's batches and over {FLOOR:g} running s.d. (root "
        f"mean square, up to {largest:.3g}) in dimensions of the {where} (of {r['latent_dim']} per head){why}; KL, AU, "
        "MI and IW-NLL of this run read the heads' running statistics, not what training saw: `python "
        "scripts/rnf_bn_heads.py RUN_DIR` gives both readings (docs/metrics.md; metrics.json: rnf_bn_heads)"
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
