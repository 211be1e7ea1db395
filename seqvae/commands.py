"""The `seqvae` entry point: `--help` and the tools (compare, sweep, export, download, …) answer
without importing torch or Lightning (seconds of start-up); fit/validate/test/predict go to the
LightningCLI in `cli.py`.
"""

from __future__ import annotations

import importlib
import sys

# The subcommands besides LightningCLI's fit/validate/test/predict: module, one-line summary.
TOOLS = {
    "compare": ("analysis.compare", "tables of finished runs; with --baseline, differences with 95% intervals"),
    "sweep": ("experiments.sweep", "a grid of variants × seeds, each cell a resumable `seqvae fit`"),
    "export": ("rundir.export", "copy a run's small result files (config, metrics, per-text, curves)"),
    "probe": ("analysis.probe", "what z knows: a logistic-regression probe of the posterior means on the texts' labels"),
    "diagnose": ("diagnostics", "is the encoder learning? weight and gradient norms, feature spread"),
    "rnf-nll": ("rnf_diagnostics", "WAE-RNF: the correct IW-NLL beside the reference's defective estimator, same draws"),
    "download": ("text.download", "fetch the Yahoo / Yelp / PTB corpora (needs a network)"),
}
USAGE = """usage: seqvae SUBCOMMAND [options]     (seqvae SUBCOMMAND --help for each one's options)

training and evaluation (LightningCLI; --config FILE, --section.key value):
  fit         train, keep the best checkpoint, test it, write metrics.json and per_text.csv
  validate    evaluate a checkpoint on the validation split
  test        evaluate a checkpoint on the test split (e.g. --ckpt_path C --data.test FILE)
  predict     reconstruct, sample or interpolate texts with a checkpoint (predictions.txt)

tools:
{tools}
"""


def main(argv: list[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] in ([], ["-h"], ["--help"]):
        print(USAGE.format(tools="\n".join(f"  {name:<11} {summary}" for name, (_, summary) in TOOLS.items())), end="")
        sys.exit(0 if words else 2)
    if words[0] in TOOLS:
        module = importlib.import_module(f".{TOOLS[words[0]][0]}", __package__)
        sys.exit(module.main(words[1:]))
    from seqvae.cli import run_lightning

    run_lightning(argv)


if __name__ == "__main__":
    main()
