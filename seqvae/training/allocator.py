"""Keep freed CPU memory in the process instead of handing it back to the kernel (glibc only).

glibc's malloc serves every block above its mmap threshold (at most 32 MiB when it adapts the
threshold itself) with a fresh mmap, and returns it with munmap on free. A training step of the
yahoo10k model allocates its logits and their gradients (32 × 80 tokens × 5,004 words ≈ 51 MB
each) anew at every step, so every step faults in and zeroes ~55k fresh pages: a third of the
step's CPU time went to the kernel (`python -m benchmarks.bench --allocator --iw-samples 100`, docs/performance.md).
PyTorch's CPU tuning guide fixes this with jemalloc or tcmalloc; the same effect needs no
dependency: raise the mmap and trim thresholds so freed blocks stay in the heap and are reused.
The cost is that the process keeps its peak heap until it exits, or until
`release_freed_memory` hands the free part back. Numerics are unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
THRESHOLD = 2**31 - 1  # mallopt takes an int: blocks below 2 GiB come from the heap


def reuse_freed_memory() -> bool:
    """Sets glibc's mmap and trim thresholds to 2 GiB; True if it did (False off glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))


def release_freed_memory(keep: int = 0) -> bool:
    """Hands the free memory the heap keeps back to the kernel (glibc `malloc_trim(0)`: the top of
    the heap is shrunk and whole free pages inside it are released); True if it released any.
    With keep > 0 it does so only when the resident size has grown by more than `keep` bytes
    since its last release (/proc/self/statm, a cheap read), so that a call after every batch
    costs nothing while the heap is steady.

    Why: with `reuse_freed_memory` nothing inside the heap is ever returned, and allocations that
    grow from batch to batch (evaluation goes through the texts by length) do not fit into the
    holes the previous ones left between small live tensors: the heap, and the resident size,
    grew by 1.2 GB over the 380 batches of 10,000 test texts (yahoo10k, K = 5). Released pages cost page faults when they are used
    again, so a release per evaluation batch only when `keep` is exceeded keeps most of the
    reuse. False off glibc."""
    global _rss_after_release
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    if keep > 0 and _rss_after_release is not None and _resident_bytes() - _rss_after_release <= keep:
        return False
    libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    released = bool(libc.malloc_trim(0))
    _rss_after_release = _resident_bytes()
    return released


_rss_after_release: int | None = None


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@functools.cache
def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
