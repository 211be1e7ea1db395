"""Which checkpoint `seqvae fit` resumes from, and which run directories it refuses to write into
(`seqvae.rundir.guards.fit_checkpoint`), on constructed run directories."""

from __future__ import annotations

import pytest

from seqvae.errors import ConfigError
from seqvae.rundir.guards import fit_checkpoint, not_a_finished_run


def run_dir(tmp_path, *files):
    run = tmp_path / "runs" / "demo" / "seed1"
    (run / "checkpoints").mkdir(parents=True)
    for name in files:
        (run / name).write_text("x")
    return run


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path):
    run = run_dir(tmp_path, "config.yaml", "checkpoints/last.ckpt")
    assert fit_checkpoint("last", str(run)) == str(run / "checkpoints" / "last.ckpt")
    assert fit_checkpoint(str(run / "checkpoints" / "last.ckpt"), str(run)) == str(run / "checkpoints" / "last.ckpt")
    assert fit_checkpoint(None, str(tmp_path / "runs" / "demo" / "new")) is None  # a new directory: from scratch


@pytest.mark.parametrize("ckpt", ["last", "checkpoints/last.ckpt", "checkpoints/best.ckpt"])
def test_a_finished_run_is_not_resumed_in_place(tmp_path, ckpt):
    """Resuming a finished run wrote metrics-2.json beside its metrics.json, which then disagreed with its config.yaml
    and checkpoints (compare and export read the stale one): refused, pointing to a new version."""
    run = run_dir(tmp_path, "config.yaml", "checkpoints/last.ckpt", "checkpoints/best.ckpt", "metrics.json")
    assert fit_checkpoint(ckpt if ckpt == "last" else str(run / ckpt), str(run)) is not None  # the checks come first
    with pytest.raises(ConfigError, match=r"is a finished run \(metrics.json\).*another trainer.logger.init_args.version"):
        not_a_finished_run(str(run))
    not_a_finished_run(str(run.parent / "seed1_longer"))  # its checkpoint, trained further in another directory


@pytest.mark.parametrize("ckpt", [None, "last"])
def test_a_run_killed_before_its_first_checkpoint_says_to_delete_it(tmp_path, ckpt):
    """Before: a rerun was told to resume with --ckpt_path, and that resume was told there is no last.ckpt."""
    run = run_dir(tmp_path, "config.yaml", "vocab.json")
    with pytest.raises(ConfigError, match="stopped before its first checkpoint.*delete that directory"):
        fit_checkpoint(ckpt, str(run))


def test_a_run_with_a_checkpoint_is_refused_without_ckpt_path_and_named_for_resuming(tmp_path):
    run = run_dir(tmp_path, "config.yaml", "checkpoints/last.ckpt")
    with pytest.raises(ConfigError, match=f"already holds a run.*--ckpt_path {run / 'checkpoints' / 'last.ckpt'}"):
        fit_checkpoint(None, str(run))


def test_a_finished_run_is_refused_without_advice_to_resume_it_in_place(tmp_path):
    """Before (a new user's report): "resume it with --ckpt_path …/last.ckpt", which `not_a_finished_run` then refused."""
    run = run_dir(tmp_path, "config.yaml", "checkpoints/last.ckpt", "metrics.json")
    with pytest.raises(ConfigError) as err:
        fit_checkpoint(None, str(run))
    message = str(err.value)
    assert "already holds a finished run (metrics.json): give another version" in message
    assert f"to train it further, add --ckpt_path {run / 'checkpoints' / 'last.ckpt'}" in message
    assert "resume it" not in message
