"""Every test starts from the same Lightning seed environment. An in-process `seqvae fit`
(LightningCLI's `seed_everything`) exports PL_GLOBAL_SEED and PL_SEED_WORKERS, and a datamodule
built later without `data.seed` takes PL_GLOBAL_SEED as its seed (`text/corpus.py`): a test that
ran the CLI changed the batch order of every later test's training (seen twice: test_bn_bound's
BN-VAE trained to another state after test_ais's, then test_bench's, in-process CLI runs)."""

from __future__ import annotations

import os

import pytest

# One torch thread in the test process and in every process it starts without a setting of its own
# (they inherit the variable; set here, before any test module imports torch; test_cli's job pool
# already set its own): the suite's networks are tiny, and at torch's default (a thread per core)
# they spin beside other work. Beside two one-thread trainings on 2 cores, test_networks' two
# init tests took 19 s this way against 128 s at the default (one run each, same commit and load;
# the whole suite: 20 min 44 s at 86fcb4a against 28 min 13 s at 35844fc, other commits and loads).
# A value the caller set is kept.
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
