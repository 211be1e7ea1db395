import resource

import pytest
import torch

from seqvae.allocator import reuse_freed_memory


def test_a_freed_large_block_is_reused_without_page_faults():
    # glibc maps every block above 32 MiB afresh (one fault per 4 KiB page when it is written)
    # and unmaps it on free; after reuse_freed_memory the second block reuses the first's pages.
    if not reuse_freed_memory():
        pytest.skip("not glibc: mallopt unavailable")
    n = 64 * 2**20 // 4  # 64 MiB of float32: 16,384 pages
    block = torch.ones(n)
    del block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(n)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert float(block.sum()) == n
    assert faults < 1000, faults
