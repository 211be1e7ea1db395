"""benchmarks/gemm_peak.py: bench.py's peak is the best of several GEMM shapes, the model's own among
them, and no achieved rate is reported as a fraction above 100% (issue 37)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: benchmarks/
from benchmarks import gemm_peak as peak  # noqa: E402

SMALL = {"small": dict(embed_dim=64, hidden_dim=128, latent_dim=32, vocab_size=5000)}


def test_the_shapes_are_the_squares_and_the_configs_own_gemms():
    shapes = peak.peak_shapes(SMALL, 32, {"small": 1}, torch.device("cpu"))
    # one IW call of a document of 81 tokens holds 2**26 // (81 * 5000) = 165 samples
    assert shapes == {
        "square 2048^3": (2048, 2048, 2048),
        "square 4096^3": (4096, 4096, 4096),
        "small output layer, training batch": (32 * 80, 128, 5000),
        "small output layer, fused training chunk": (2**22 // 5000, 128, 5000),
        "small output layer, IW call": (165 * 80, 128, 5000),
        "small output layer, fused IW chunk": (2**22 // 5000, 128, 5000),  # 838 rows, above the eval floor of 800
        "small LSTM step, training batch": (32, 64 + 32 + 128, 4 * 128),
        "small LSTM step, IW call": (165, 64 + 32 + 128, 4 * 128),
    }


def test_the_peak_is_the_best_shape_and_names_it(monkeypatch):
    rates = {(8, 8, 8): 10.0, (16, 8, 4): 30.0, (4, 4, 4): 20.0}
    monkeypatch.setattr(peak, "gemm_gflops", lambda m, k, n, *a: rates[(m, k, n)])
    lines = []
    got = peak.measure_peak({"a": (8, 8, 8), "b": (16, 8, 4), "c": (4, 4, 4)}, torch.float32, "cpu", lines.append)
    assert got == {"gflops": {"a": 10.0, "b": 30.0, "c": 20.0}, "peak_gflops": 30.0, "peak_shape": "b", "peak_mkn": [16, 8, 4]}
    assert len(lines) == 4 and "set by b" in lines[-1] and "30.0 GFLOP/s" in lines[-1]


@pytest.mark.parametrize("rate", [50.0, 100.0])
def test_a_rate_up_to_the_peak_is_a_fraction(rate):
    fields, text = peak.rate_against_peak(rate, 100.0)
    assert fields == {"fraction_of_peak": rate / 100} and f"{rate / 100:.1%} of peak" in text


def test_a_rate_above_the_peak_has_no_fraction_but_says_by_how_much():
    fields, text = peak.rate_against_peak(108.2, 100.0)
    assert fields["fraction_of_peak"] is None and fields["above_peak_by"] == pytest.approx(0.082)
    assert "ABOVE the measured peak by 8.2%" in text and "of peak" not in text
