"""KL weight schedules (SPEC §3)."""

from __future__ import annotations

import pytest

from seqvae.core.schedules import ConstantKL, CyclicalKL, LinearKLWarmup


@pytest.mark.parametrize("start", [0.0, 0.1, 0.3, 0.7])
@pytest.mark.parametrize("warmup", [1, 2, 3, 7, 10])
@pytest.mark.parametrize("n", [1, 3, 7, 13, 334])
def test_linear_warmup(start, warmup, n):
    s = LinearKLWarmup(start=start, warmup_epochs=warmup)
    total = warmup * n
    # the weight rises BEFORE every update, so update 0 already has one step
    assert s.weight(0, n, 100) == pytest.approx(start + (1 - start) / total, abs=1e-15)
    weights = [s.weight(u, n, 100) for u in range(total + 5)]
    assert weights[total - 1] == 1.0  # exactly, not 1 - ε
    if total >= 2:
        assert weights[total - 2] < 1.0
        assert weights[total - 2] == pytest.approx(start + (1 - start) * (total - 1) / total, abs=1e-12)
    assert all(w == 1.0 for w in weights[total - 1 :])  # capped
    assert all(b >= a for a, b in zip(weights, weights[1:]))
    assert s.weight(10 * total, n, 100) == 1.0


def test_linear_warmup_values():
    s = LinearKLWarmup(start=0.1, warmup_epochs=2)
    # 0.9 / (2 · 9) = 0.05 per update
    assert [round(s.weight(u, 9, 5), 12) for u in range(19)] == [round(0.15 + 0.05 * u, 12) for u in range(17)] + [1.0, 1.0]
    assert LinearKLWarmup(start=0.4, warmup_epochs=0).weight(0, 10, 5) == 1.0


@pytest.mark.parametrize("value", [0.0, 0.5, 1.0, 2.0])
def test_constant(value):
    s = ConstantKL(value)
    assert {s.weight(u, 7, 3) for u in (0, 1, 10, 10_000)} == {value}


def test_cyclical():
    s = CyclicalKL(cycles=4, ratio=0.5)
    n, epochs = 10, 4  # 40 updates, period 10, rising over the first 5 updates of each cycle
    weights = [s.weight(u, n, epochs) for u in range(40)]
    one_cycle = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert weights == pytest.approx(one_cycle * 4, abs=1e-12)
    for c in range(4):
        assert weights[10 * c] == 0.0  # restarts at each period


def test_cyclical_ratio_and_fractional_period():
    s = CyclicalKL(cycles=3, ratio=0.25)
    n, epochs = 5, 3  # 15 updates, period 5, ramp over 1.25 updates
    assert [s.weight(u, n, epochs) for u in range(15)] == pytest.approx([0.0, 0.8, 1.0, 1.0, 1.0] * 3)
    s = CyclicalKL(cycles=2, ratio=0.5)
    n, epochs = 3, 1  # 3 updates, period 1.5, ramp over 0.75
    assert [s.weight(u, n, epochs) for u in range(3)] == pytest.approx([0.0, 1.0, 2 / 3])
