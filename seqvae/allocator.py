"""Keep freed CPU memory in the process instead of handing it back to the kernel (glibc only).

glibc's malloc serves every block above its mmap threshold (at most 32 MiB when it adapts the
threshold itself) with a fresh mmap, and returns it with munmap on free. A training step of the
yahoo10k model allocates its logits and their gradients (32 × 80 tokens × 5,004 words ≈ 51 MB
each) anew at every step, so every step faults in and zeroes ~55k fresh pages: a third of the
step's CPU time went to the kernel (`python scripts/bench_malloc.py`, docs/performance.md).
PyTorch's CPU tuning guide fixes this with jemalloc or tcmalloc; the same effect needs no
dependency: raise the mmap and trim thresholds so freed blocks stay in the heap and are reused.
The cost is that the process keeps its peak heap until it exits. Numerics are unchanged.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
