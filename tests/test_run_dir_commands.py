"""`seqvae diagnose` and `seqvae rnf-nll` on bad input: one line, exit 2, nothing written or
overwritten. Before: a missing config.yaml or a file that is no checkpoint gave a traceback (the
checkpoint was read by Lightning's loader, not seqvae's weights-only one), and `--per-text`
overwrote any file, the run's own metrics.json included. Run directories are made here by hand."""

from __future__ import annotations

import pytest
import torch
from test_scoring import run


def run_dir(tmp_path, checkpoint: bytes | object | None, config: bool = True):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    if config:
        (run / "config.yaml").write_text("data: {train: train.txt}\n")
    ckpt = run / "checkpoints" / "best.ckpt"
    if isinstance(checkpoint, bytes):
        ckpt.write_bytes(checkpoint)
    elif checkpoint is not None:
        torch.save(checkpoint, ckpt)
    return run


@pytest.mark.parametrize("command", ["diagnose", "rnf-nll"])
@pytest.mark.parametrize(
    "checkpoint, config, says",
    [
        (b"x", False, "{run}: no config.yaml (not a run directory of seqvae fit)"),
        (None, True, "{run}/checkpoints/best.ckpt: no such checkpoint"),
        (b"w1 the cat\n", True, "RUN_DIR: {run}/checkpoints/best.ckpt: not a readable checkpoint (11 bytes: truncated, "
                                "or not a file written by torch.save / seqvae fit)"),
        ({"a": 1}, True, "RUN_DIR: {run}/checkpoints/best.ckpt: a torch.save file, but not a checkpoint of `seqvae fit` "
                         "(it holds a dict with keys 'a'; a checkpoint is Lightning's dict with the model's 'state_dict', "
                         "as RUN/checkpoints/best.ckpt)"),
    ],
    ids=["no_config", "no_checkpoint", "text", "dict"],
)  # fmt: skip
def test_a_bad_run_directory_is_one_line_and_exit_2(tmp_path, capsys, command, checkpoint, config, says):
    run_path = run_dir(tmp_path, checkpoint, config)
    status, err = run([command, run_path], capsys)
    assert status == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [f"seqvae {command}: error: {says.format(run=run_path)}"]


def test_rnf_nll_writes_a_new_per_text_file_only(tmp_path, capsys):
    run_path = run_dir(tmp_path, b"x")
    metrics = run_path / "metrics.json"
    metrics.write_text('{"test/iw_nll": 1.0}')
    for target in (metrics, tmp_path):  # the run's own results; a directory
        status, err = run(["rnf-nll", run_path, "--per-text", target], capsys)
        assert status == 2 and err.strip().splitlines()[-1] == (
            f"seqvae rnf-nll: error: --per-text {target}: exists (this command writes a new file only; move it aside)"
        ), err
    assert metrics.read_text() == '{"test/iw_nll": 1.0}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
