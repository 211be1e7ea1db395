"""Every test starts from the same Lightning seed environment. An in-process `seqvae fit`
(LightningCLI's `seed_everything`) exports PL_GLOBAL_SEED and PL_SEED_WORKERS, and a datamodule
built later without `data.seed` takes PL_GLOBAL_SEED as its seed (`text/corpus.py`): a test that
ran the CLI changed the batch order of every later test's training (seen twice: test_bn_bound's
BN-VAE trained to another state after test_ais's, then test_bench's, in-process CLI runs)."""

from __future__ import annotations

import os

import pytest

SEED_VARIABLES = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS")


@pytest.fixture(autouse=True)
def lightning_seed_environment():
    saved = {name: os.environ.get(name) for name in SEED_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
