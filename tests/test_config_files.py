"""A `--config` file is read strictly (`seqvae.config_sources.load_yaml`): a key given twice in one mapping is
refused with its file and line, where YAML's loaders keep the last value without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqvae.config_sources import load_yaml
from seqvae.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "text, line, key",
    [
        ("model: {lr: 0.5}\ntrainer: {max_epochs: 1}\nmodel: {pooling: max}\n", 3, "model"),  # two top-level blocks
        ("model:\n  lr: 0.5\n  pooling: max\n  lr: 1.0\n", 4, "lr"),  # inside one block
    ],
)
def test_a_key_given_twice_is_refused_with_its_file_and_line(tmp_path, text, line, key):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"--config {path}:{line}:\d+: .*key '{key}' given twice"):
        load_yaml(str(path))


def test_anchors_merge_keys_and_lists_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("a: &x {b: 1}\nc:\n  <<: *x\n  d: 2\ne: [1, 2]\n")
    assert load_yaml(str(path)) == {"a": {"b": 1}, "c": {"b": 1, "d": 2}, "e": [1, 2]}


def test_every_committed_config_has_each_key_once():
    files = sorted((REPO / "configs").rglob("*.yaml"))
    assert len(files) > 50
    for path in files:
        load_yaml(str(path))  # raises on a repeated key


def test_a_grid_file_with_a_key_given_twice_is_refused(tmp_path):
    from seqvae.experiments.grid import GridError, load_grid

    path = tmp_path / "grid.yaml"
    path.write_text("root: runs/x\nseeds: [1]\nvariants: [{name: a}]\nseeds: [2, 3]\n")
    with pytest.raises(GridError, match=f"{path}:4:1: not valid YAML: key 'seeds' given twice"):
        load_grid(path)


def test_every_committed_grid_file_has_each_key_once():
    from seqvae.experiments.grid import load_grid

    for path in sorted((REPO / "configs" / "sweeps").glob("*.yaml")):
        assert load_grid(path), path
