"""GPU-only checks (skipped without CUDA; run on the device machine: `pytest tests/test_gpu.py`)."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from test_model import datamodule, tiny_model, write_corpus

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_bf16_and_fp32_iw_nll_agree_on_a_trained_model(tmp_path):
    # bf16 autocast runs the GEMMs and the LSTMs in bf16; the densities (KL, log q, the IW
    # weights, the per-token log-probs' sums) stay fp32. Agreement to 0.1 nats per document.
    write_corpus(tmp_path / "train.txt", 400, 0)
    write_corpus(tmp_path / "valid.txt", 60, 1)
    write_corpus(tmp_path / "test.txt", 60, 2)
    dm = datamodule(tmp_path)
    pl.seed_everything(0)
    model = tiny_model(dm.vocab_size, embed_dim=32, hidden_dim=64, latent_dim=8, test_iw_samples=100)
    common = dict(accelerator="gpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    pl.Trainer(max_epochs=5, **common).fit(model, dm)
    fp32 = pl.Trainer(precision="32-true", **common).test(model, dm, verbose=False)[0]
    bf16 = pl.Trainer(precision="bf16-mixed", **common).test(model, dm, verbose=False)[0]
    assert fp32["test/kl"] > 0.05  # a posterior that carries something, so q(z|x) matters
    assert abs(fp32["test/iw_nll"] - bf16["test/iw_nll"]) < 0.1, (fp32, bf16)
    assert abs(fp32["test/kl"] - bf16["test/kl"]) < 0.1
