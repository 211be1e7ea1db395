"""TF32 on CUDA for fp32 runs, its off switch, its record in provenance, and 16-mixed refused
(seqvae/training/precision.py, issue 46). A stand-in trainer says "CUDA": the settings are
torch's global flags, which a CPU build holds too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from seqvae.errors import ConfigError
from seqvae.rundir.provenance import device_facts
from seqvae.training.precision import HALF_REFUSED, MatmulPrecision


@pytest.fixture
def restored():
    saved = torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1:]


def trainer_on(device: str, precision: str):
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), precision=precision)


def flags():
    return torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


def test_an_fp32_run_on_cuda_uses_tf32_by_default_and_full_fp32_when_told(restored):
    MatmulPrecision().setup(trainer_on("cuda", "32-true"), None, "fit")
    assert flags() == ("high", True, True)
    MatmulPrecision(tf32=False).setup(trainer_on("cuda", "32-true"), None, "test")
    assert flags() == ("highest", False, False)


def test_the_cpu_and_bf16_runs_are_left_as_they_are(restored):
    torch.set_float32_matmul_precision("highest")
    before = flags()
    MatmulPrecision().setup(trainer_on("cpu", "32-true"), None, "fit")
    MatmulPrecision().setup(trainer_on("cpu", "bf16-mixed"), None, "fit")  # Lightning's reading of 16-mixed on the CPU
    MatmulPrecision().setup(trainer_on("cuda", "bf16-mixed"), None, "fit")
    assert flags() == before


def test_16_mixed_training_on_cuda_is_refused_in_one_line(restored):
    with pytest.raises(ConfigError) as err:
        MatmulPrecision().setup(trainer_on("cuda", "16-mixed"), None, "fit")
    assert str(err.value) == HALF_REFUSED and "\n" not in HALF_REFUSED


def test_provenance_records_tf32_on_cuda_only():
    facts = device_facts()
    if torch.cuda.is_available():
        assert facts["matmul_tf32"] == (torch.get_float32_matmul_precision() != "highest")
        assert facts["cudnn_tf32"] == torch.backends.cudnn.allow_tf32
    else:
        assert facts["matmul_tf32"] is None and facts["cudnn_tf32"] is None
