"""Monte-Carlo noise of the MI estimators on posteriors that ignore x (true MI 0).

Every one of M texts gets the same posterior N(0, I) in Z dimensions, as a fully collapsed
encoder gives, so I(x; z) = 0 exactly and whatever the estimator reports is its noise. For each
of R evaluation seeds this computes:
  - `mi_dataset` as `seqvae test` does: the pool of all M posteriors, 10 z per posterior;
  - the same pool with 1 z per posterior (He et al.'s estimator on the whole set);
  - `mi` as validation/test log it: the pool of each batch of B texts, 1 z per posterior,
    averaged over batches weighted by their size;
and prints each one's mean and standard deviation over the seeds, beside the closed form of
the pooled one-sample s.d.: with identical posteriors log q(z) = log N(z; 0, I), whose s.d. is
sqrt(Z/2), so the estimate's s.d. is sqrt(Z/2) / sqrt(M·S).

    python scripts/mi_noise.py                    # M 1000, Z 32, B 32, 200 seeds
    python scripts/mi_noise.py --texts 10000 --seeds 50
"""

from __future__ import annotations

import argparse
import math

import torch

from seqvae.metrics import mutual_information


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=1000, help="M, the pool of posteriors")
    parser.add_argument("--latent", type=int, default=32, help="Z")
    parser.add_argument("--batch", type=int, default=32, help="B, the per-batch pool of `mi`")
    parser.add_argument("--seeds", type=int, default=200, help="R, evaluation seeds")
    args = parser.parse_args()
    m, nz, b = args.texts, args.latent, args.batch
    mu = torch.zeros(m, nz, dtype=torch.float64)
    logvar = torch.zeros(m, nz, dtype=torch.float64)
    rows = {"mi_dataset (pool M, 10 z each)": [], "pool M, 1 z each": [], f"mi (pool of each batch of {b}, 1 z)": []}
    for seed in range(args.seeds):
        gen = torch.Generator().manual_seed(seed)
        rows["mi_dataset (pool M, 10 z each)"].append(float(mutual_information(mu, logvar, gen, samples=10)))
        rows["pool M, 1 z each"].append(float(mutual_information(mu, logvar, gen)))
        per_batch = sum(min(b, m - s) * float(mutual_information(mu[s : s + b], logvar[s : s + b], gen)) for s in range(0, m, b))
        rows[f"mi (pool of each batch of {b}, 1 z)"].append(per_batch / m)
    print(f"identical posteriors N(0, I): M = {m} texts, Z = {nz}, {args.seeds} evaluation seeds; true MI 0")
    for name, values in rows.items():
        t = torch.tensor(values)
        print(f"{name:40s} mean {t.mean():+.4f}  s.d. {t.std():.4f}  max |value| {t.abs().max():.4f}")
    for samples in (1, 10):
        print(f"closed-form s.d., pool M, {samples:2d} z each: sqrt(Z/2)/sqrt(M*S) = {math.sqrt(nz / 2 / (m * samples)):.4f}")


if __name__ == "__main__":
    main()
