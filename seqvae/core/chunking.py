"""How the fused output layer (`fused_ce`) cuts its rows, and the IW budget, per device (issue 46).

The CPU figures are the ones the CPU was tuned with (fused_ce's constants, docs/performance.md)
and stay exactly as they were: same chunks, same values. On a GPU those sizes are cache-sized
and cost what a GPU cannot hide: 256-row training chunks re-read and rewrite the output layer's
fp32 dW (82 MB at the paper's size) ten times per batch, 800-row evaluation chunks make ~80
calls per IW decoder call, and selecting the real tokens with a boolean mask reads the mask's
count back to the host (one sync each). So on CUDA a training batch is one chunk (logits up to
2**28 fp32 = 1 GiB), evaluation chunks have thousands of rows, and every row goes through the
output layer with padding weighted 0 instead of being selected (bucket batches have no padding:
nothing is wasted; padded batches compute their padding).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chunking:
    """Rows per fused output-layer chunk, and how padding is left out.

    chunk_elements: logits per chunk (rows = chunk_elements // V, at least the minimum);
    train_min_rows / eval_min_rows: the minimum with / without gradients; None: fused_ce's own
    choice (the CPU's); select_real: boolean-select the real tokens (True) or weight rows by the mask."""

    chunk_elements: int | None
    train_min_rows: int | None
    eval_min_rows: int | None
    select_real: bool
    host_reads_at_logging_only: bool = False  # the finite check and logged values (training/host_reads.py)

    def rows(self, vocab_size: int, training: bool) -> int | None:
        if self.chunk_elements is None:
            return None  # fused_ce.chunk_rows: today's CPU sizes
        return max(self.train_min_rows if training else self.eval_min_rows, self.chunk_elements // vocab_size)


CPU = Chunking(None, None, None, select_real=True)
CUDA = Chunking(2**28, 256, 8192, select_real=False, host_reads_at_logging_only=True)


def chunking_for(device_type: str) -> Chunking:
    return CUDA if device_type == "cuda" else CPU


def iw_budget(device_type: str, free_bytes: int | None) -> int:
    """The default IW decoder-call budget, in logits-equivalent (B·K·T·V) elements: 2**26 on the
    CPU (today's). On CUDA a quarter of the free memory in elements: the fused path never holds
    the B·K·T·V logits, only ~B·K·T·(E + Z + 6H) fp32 LSTM values and one chunk's logits (at the
    paper's size ~1/8 of the logits' size), so this keeps a decoder call to ~1/30 of the free
    memory: about 375 samples of 32 texts per call on an 80 GB card (before: a 64th, ~25)."""
    if device_type != "cuda" or free_bytes is None:
        return 2**26
    return max(2**26, free_bytes // 4)
