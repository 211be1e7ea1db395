"""A command reads its `--ckpt_path` once (issue 47): the refusal of a code-carrying file, the
checkpoint's settings and vocabulary (training/retest.py), a resume's checks (training/resume.py)
and Lightning's restore all get the same read (`store.checkpoints.share`, `LoaderIO`). Counted
by wrapping torch.load; before, `seqvae test --ckpt_path` read the file five times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_model import write_corpus

from seqvae.cli import SeqVAECLI
from seqvae.store import checkpoints
from seqvae.training.callbacks import AtomicCheckpointIO

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-epoch demo-config run of a tiny model on a tiny corpus: (its arguments, its run directory)."""
    root = tmp_path_factory.mktemp("reads")
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(root / f"{name}.txt", 40, seed)
    args = [f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={root / 'train.txt'}", f"--data.val={root / 'valid.txt'}",
            f"--data.test={root / 'test.txt'}", "--model.embed_dim=8", "--model.hidden_dim=12", "--model.latent_dim=4",
            "--model.val_iw_samples=0", "--model.test_iw_samples=2", f"--trainer.logger.init_args.save_dir={root}",
            "--trainer.enable_model_summary=false"]  # fmt: skip
    SeqVAECLI(args=["fit", *args, "--trainer.max_epochs=1"])
    return args, root / "demo" / "version_0"


def reads_during(monkeypatch, command: list[str]) -> tuple[list[str], SeqVAECLI]:
    """The files torch.load reads while the CLI runs `command`, and the CLI."""
    reads = []
    load = torch.load

    def counted(f, *args, **kwargs):
        reads.append(str(getattr(f, "name", f)))
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counted)
    try:
        cli = SeqVAECLI(args=command)
    finally:
        monkeypatch.setattr(torch, "load", load)
    return reads, cli


@pytest.mark.parametrize("subcommand", ["test", "validate", "predict"])
def test_scoring_a_checkpoint_reads_it_once(run, subcommand, monkeypatch):
    args, run_dir = run
    best = run_dir / "checkpoints" / "best.ckpt"
    reads, _ = reads_during(monkeypatch, [subcommand, *args, f"--ckpt_path={best}"])
    assert reads == [str(best)]
    assert checkpoints._SHARED == {}  # not kept past the command
    if subcommand == "test":  # what the one read gave: the checkpoint's vocabulary, its test written
        scored = run_dir.parent / "version_1"
        assert json.loads((scored / "metrics.json").read_text())["checkpoint"] == str(best)
        assert (scored / "per_text.csv").read_text().count("\n") == 41  # header + the 40 test texts


def test_a_resume_reads_its_checkpoint_once(run, monkeypatch):
    args, run_dir = run
    # the finished run trained a second epoch into another directory (a finished run is not resumed in place)
    last, best = run_dir / "checkpoints" / "last.ckpt", run_dir.parent / "longer" / "checkpoints" / "best.ckpt"
    resume = ["fit", *args, "--trainer.max_epochs=2", "--trainer.logger.init_args.version=longer", f"--ckpt_path={last}"]
    reads, cli = reads_during(monkeypatch, resume)
    assert reads == [str(last), str(best)]  # then fit's own test of the new run's best.ckpt
    assert type(cli.trainer.strategy.checkpoint_io) is AtomicCheckpointIO  # and the run's writes stay atomic


def test_last_ckpt_is_the_last_epochs_state_when_val_loss_did_not_improve(tmp_path):
    """With `checkpoint.mode max` val/loss "improves" only at the first epoch, so best.ckpt stays there;
    last.ckpt must still hold the final epoch's weights and counters (Lightning 2.6 alone left it at
    the best epoch: a resume retrained every epoch since, and "the last checkpoint" was the best)."""
    for name, seed in (("train", 0), ("valid", 1), ("test", 2)):
        write_corpus(tmp_path / f"{name}.txt", 40, seed)
    SeqVAECLI(args=["fit", f"--config={CONFIGS / 'demo.yaml'}", f"--data.train={tmp_path / 'train.txt'}",
                    f"--data.val={tmp_path / 'valid.txt'}", f"--data.test={tmp_path / 'test.txt'}", "--model.embed_dim=8",
                    "--model.hidden_dim=12", "--model.latent_dim=4", "--model.val_iw_samples=0", "--model.test_iw_samples=2",
                    f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.enable_model_summary=false",
                    "--trainer.max_epochs=3", "--checkpoint.mode=max"])  # fmt: skip
    run = tmp_path / "demo" / "version_0"
    metrics = json.loads((run / "metrics.json").read_text())
    best, last = (torch.load(run / "checkpoints" / f"{n}.ckpt", weights_only=False) for n in ("best", "last"))
    assert last["seqvae"]["num_updates"] == metrics["updates"] > metrics["best_updates"] == best["seqvae"]["num_updates"]
    assert last["epoch"] == 2 and best["epoch"] == 0
