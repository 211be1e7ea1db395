"""WAE-RNF's reference-code IW-NLL estimator (its `--iw`; whether it made the published 339.0 is not
verified, SPEC §12.7), kept as a diagnostic, beside the correct one on the same checkpoint and the
same draws: how far the reference's number is from the NLL bound.

    seqvae rnf-nll RUN_DIR [--checkpoint best|last] [--split test|val] [--samples 500] [--seed 0] [--per-text FILE]

RUN_DIR is a run directory of a `PlanarFlowPosterior` model (config.yaml, checkpoints/). Prints the
mean over the split's texts of the correct IW-NLL (what `seqvae test` reports as test/iw_nll) and of
the reference's, from the same K draws z0 ~ q0 per text.

The reference (kingofspace0wzz/wae-rnf-lm, `model.py:191–216`; ../shared/SPEC.md §12.5) weights
each draw by log N(z0; 0, I) + log p̂(x|z_K) − [log q0(z0|x) + S(z0)], where
  (a) the prior is evaluated at z0 instead of z_K,
  (b) the flow's log-determinant S is ADDED to log q0 (log q_K = log q0 − S),
  (c) log p̂(x|z_K) is the batch's mean log-likelihood for that draw, the same for every text;
so per draw its log-weight exceeds the correct one by log N(z0) − log N(z_K) − 2·S(z0) before (c)
mixes the texts. It is not a bound on anything: never a metric of a run.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from seqvae.core.gaussian import log_standard_normal
from seqvae.core.metrics import LogLikelihood, iw_nll_from_weights
from seqvae.core.planar_flow import PlanarFlowPosterior
from seqvae.diagnostics import open_run, refuse


def flow_iw_log_weights(log_likelihood: LogLikelihood, q, n_samples: int, chunk: int, generator=None):
    """(correct, reference) log-weights (B, K) of the flow posterior `q` (`PlanarFlowGaussian`) from
    the same draws: correct = log p(x|z_K) + log N(z_K) − (log q0(z0|x) − S(z0)) (what
    `metrics.posterior_iw_log_weights` computes); reference = mean_batch log p(x|z_K) + log N(z0) −
    (log q0(z0|x) + S(z0)), defects (a)–(c) above."""
    z0 = q.base.sample(n_samples, generator)
    zk, log_det, _ = q.flow(z0)
    ll = torch.cat([log_likelihood(zk[:, s : s + chunk]) for s in range(0, n_samples, chunk)], dim=1)
    log_q0 = q.base.log_prob(z0)
    correct = ll + log_standard_normal(zk) - (log_q0 - log_det)
    reference = ll.mean(0, keepdim=True) + log_standard_normal(z0) - (log_q0 + log_det)
    return correct, reference


def both_iw_nll(model, batch: dict, n_samples: int, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, reference) IW-NLL per text (B,) of one batch of `model` (a SeqVAE in eval mode)."""
    tokens, lengths = batch["tokens"], batch["lengths"]
    q, _ = model.encoder.encode(tokens, lengths)
    if not hasattr(q, "flow"):
        raise refuse("rnf-nll", f"the model's posterior is {type(model.encoder.posterior).__name__}, not a flow")
    ll = lambda z: model.decoder.log_likelihood(tokens, lengths, z)  # noqa: E731
    correct, reference = flow_iw_log_weights(ll, q, n_samples, model.iw_chunk(tokens), generator)
    return iw_nll_from_weights(correct), iw_nll_from_weights(reference)


def compare_estimators(run: Path, checkpoint: str = "best", split: str = "test", samples: int = 500, seed: int = 0) -> dict:
    model, dm = open_run(run, checkpoint, "rnf-nll")
    model.eval()
    if not isinstance(model.encoder.posterior, PlanarFlowPosterior):
        raise refuse("rnf-nll", f"{run}: the model's posterior is {type(model.encoder.posterior).__name__}, not a flow")
    dm.setup("test" if split == "test" else "validate")
    loader = dm.test_dataloader() if split == "test" else dm.val_dataloader()
    gen = torch.Generator().manual_seed(seed)
    rows: list[tuple[int, float, float]] = []  # (index in the split, correct, reference) per text
    with torch.no_grad():
        for batch in loader:
            correct, reference = both_iw_nll(model, batch, samples, gen)
            index = batch["index"].tolist() if "index" in batch else range(len(rows), len(rows) + correct.numel())
            rows += zip(index, correct.double().tolist(), reference.double().tolist())
    rows.sort()
    n = len(rows)
    return {
        "texts": n,
        "iw_nll": sum(r[1] for r in rows) / n,
        "reference_iw_nll": sum(r[2] for r in rows) / n,
        "per_text": rows,
    }


def per_text_file(rows: list[tuple[int, float, float]]) -> str:
    """index,iw_nll,reference_iw_nll per text: `python -m seqvae.analysis.estimator_gap RUN --file F
    --estimate reference_iw_nll` pairs them by text (and by seed over runs)."""
    return "index,iw_nll,reference_iw_nll\n" + "".join(f"{i},{c:.6f},{r:.6f}\n" for i, c, r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="seqvae rnf-nll", description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("run", type=Path)
    p.add_argument("--checkpoint", default="best", choices=["best", "last"])
    p.add_argument("--split", default="test", choices=["test", "val"])
    p.add_argument("--samples", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-text", type=Path, metavar="FILE", help="also write both estimates per text (CSV) to FILE")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error(f"--samples: must be >= 1, got {args.samples}")
    if args.per_text is not None and not args.per_text.parent.is_dir():
        p.error(f"--per-text {args.per_text}: no directory {args.per_text.parent}")
    if args.per_text is not None and (args.per_text.exists() or args.per_text.is_symlink()):
        # it overwrote anything, the run's own metrics.json included, or failed on a directory after the work
        p.error(f"--per-text {args.per_text}: exists (this command writes a new file only; move it aside)")
    r = compare_estimators(args.run, args.checkpoint, args.split, args.samples, args.seed)
    if args.per_text is not None:
        tmp = args.per_text.with_name(f".{args.per_text.name}.tmp")
        tmp.write_text(per_text_file(r["per_text"]), encoding="utf-8")
        tmp.replace(args.per_text)  # whole or not at all
    print(f"{args.run} ({args.checkpoint}.ckpt), {args.split}: {r['texts']} texts, K = {args.samples}, the same draws for both")
    print(f"IW-NLL (correct: prior at z_K, log q_K = log q0 − S, each text's own likelihood): {r['iw_nll']:.3f} nats")
    print(f"the reference's estimator (SPEC §12.5 (a)-(c); not a bound):                    {r['reference_iw_nll']:.3f} nats")
    print(f"reference − correct: {r['reference_iw_nll'] - r['iw_nll']:+.3f} nats")
    if args.per_text is not None:
        print(f"per text: {args.per_text}")
    return 0 if math.isfinite(r["iw_nll"]) else 1
