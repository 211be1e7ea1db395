"""fp32 runs on CUDA do their matmuls in TF32 (issue 46), and the one precision seqvae refuses.

torch's own default on CUDA is half TF32, half fp32, unsaid: cuDNN's LSTM uses TF32
(`torch.backends.cudnn.allow_tf32` is True), while matmuls, the output layer among them (62% of a
paper-size training step's FLOPs, 76% of IW-NLL's), run full fp32. `MatmulPrecision` makes an fp32
run (`trainer.precision 32-true`) on CUDA use TF32 for both, or for neither with
`--matmul.tf32 false`; the setting is recorded in metrics.json's provenance (`matmul_tf32`,
`cudnn_tf32`). On the CPU nothing is changed: values and speed stay as they were.

`16-mixed` (fp16 with a loss scale) is refused on CUDA in one line: seqvae steps its optimisers
itself, and its gradient clipping would see gradients still multiplied by the loss scale (every
update shrunk by it), and its finite check would stop at the first overflow the scaler is meant
to skip. `bf16-mixed` needs no loss scale and runs (on the CPU Lightning turns `16-mixed` into
it); what it changes is in docs/performance.md.
"""

from __future__ import annotations

import torch
from pytorch_lightning import Callback

from seqvae.errors import ConfigError

HALF_REFUSED = (
    "trainer.precision: 16-mixed is not supported (seqvae clips its gradients itself, before the loss "
    "scale is taken out): use 32-true (TF32 matmuls on CUDA) or bf16-mixed"
)


def set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and cuDNN (the LSTM) together, or for neither (full fp32)."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


class MatmulPrecision(Callback):
    """How an fp32 run on CUDA multiplies (the CLI's `matmul` group).

    Args:
        tf32: fp32 matmuls and the cuDNN LSTM in TF32 (10-bit mantissa products, fp32 sums) on a
            CUDA device; False: full fp32 for both. No effect on the CPU or under bf16-mixed.
    """

    def __init__(self, tf32: bool = True):
        self.tf32 = tf32

    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.strategy.root_device.type != "cuda":
            return
        if stage == "fit" and str(trainer.precision) in ("16-mixed", "16"):
            raise ConfigError(HALF_REFUSED)  # before the run directory is written (the config callback comes later)
        if str(trainer.precision) in ("32-true", "32"):
            set_tf32(self.tf32)
