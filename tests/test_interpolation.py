"""omegaconf interpolation in --config files (parser mode omegaconf+): an overlay may refer to a key
that another file or the command line sets, and the value it gets is the merged one; one that does
not resolve is a one-line error naming the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from seqvae.cli import parse_only, run_lightning

DEMO = str(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")


def printed_model(args, capsys) -> dict:
    with pytest.raises(SystemExit) as done:
        run_lightning(["fit", *args, "--print_config"])
    assert done.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)["model"]


def test_an_overlay_refers_to_a_key_of_another_file_and_of_the_command_line(tmp_path, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  latent_dim: 8\n  embed_dim: ${model.hidden_dim}\n")  # hidden_dim: demo.yaml's
    demo_hidden = yaml.safe_load(Path(DEMO).read_text())["model"]["hidden_dim"]
    model = printed_model(["--config", DEMO, "--config", str(overlay)], capsys)
    assert (model["embed_dim"], model["hidden_dim"], model["latent_dim"]) == (demo_hidden, demo_hidden, 8)
    model = printed_model(["--config", DEMO, "--config", str(overlay), "--model.hidden_dim", "40"], capsys)
    assert (model["embed_dim"], model["hidden_dim"]) == (40, 40)  # resolved after the command line


def test_an_interpolation_that_does_not_resolve_is_one_line_naming_key_and_file(tmp_path, capsys):
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  embed_dim: ${model.hiden_dim}\n")
    with pytest.raises(SystemExit) as done:
        run_lightning(["fit", "--config", DEMO, "--config", str(overlay)])
    err = capsys.readouterr().err.strip()
    assert done.value.code == 2 and "\n" not in err
    assert err.startswith("seqvae: error: model.embed_dim: Interpolation key") and "hiden_dim" in err
    assert err.endswith(f"(in --config {overlay})")
    assert parse_only(["--config", DEMO, "--config", str(overlay)]) == err[len("seqvae: error: ") :]
