import subprocess
import sys

import pytest

from seqvae.allocator import reuse_freed_memory

# Run in a fresh interpreter, as the `seqvae` command calls it: first thing, before other
# threads and a fragmented heap (in a long pytest process, earlier tests' threads and heap
# layout can serve the block from elsewhere, which says nothing about the setting).
PROBE = """
import resource, sys, torch
from seqvae.allocator import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "on" else False
n = 64 * 2**20 // 4  # 64 MiB of float32: 16,384 pages
block = torch.ones(n)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = torch.ones(n)
assert float(block.sum()) == n
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults_of_a_second_block(setting: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, setting], check=True, capture_output=True, text=True).stdout
    applied, faults = out.split()
    return applied == "True", int(faults)


def test_a_freed_large_block_is_reused_without_page_faults():
    # glibc maps every block above 32 MiB afresh (one fault per 4 KiB page when it is written)
    # and unmaps it on free; after reuse_freed_memory the second block reuses the first's pages.
    if not reuse_freed_memory():
        pytest.skip("not glibc: mallopt unavailable")
    applied, faults = faults_of_a_second_block("on")
    assert applied and faults < 1000, faults
    _, faults_default = faults_of_a_second_block("off")
    assert faults_default > 10 * max(faults, 100)  # the probe does measure what the setting removes
