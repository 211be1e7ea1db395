"""Every test starts from the same Lightning seed environment. An in-process `seqvae fit`
(LightningCLI's `seed_everything`) exports PL_GLOBAL_SEED and PL_SEED_WORKERS, and a datamodule
built later without `data.seed` takes PL_GLOBAL_SEED as its seed (`text/corpus.py`): a test that
ran the CLI changed the batch order of every later test's training (seen twice: test_bn_bound's
BN-VAE trained to another state after test_ais's, then test_bench's, in-process CLI runs)."""

from __future__ import annotations

import os

import pytest

# One torch thread in the test process and in every CLI process it starts (they inherit the
# variable; set here, before any test module imports torch): the suite's networks are tiny, and
# test_cli's job pool runs CLI processes side by side, which at torch's default (a thread per core)
# oversubscribe the cores and spin. Beside two one-thread trainings on 2 cores the suite took 20 min
# 44 s this way against 28 min 13 s at the default (issue 48's session-9 note). A value the caller
# set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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
