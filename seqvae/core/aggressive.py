"""Aggressive inference-network training (He et al. 2019, Algorithm 1, as its code does it).

While active, every training batch X gets an inner loop of encoder-only updates — on X first,
then on uniformly drawn training batches — stopped by a window rule on the loss per word, then
one decoder-only update on X. At the end of every epoch the validation MI (per-batch estimator)
is compared with the previous epoch's; the first time it drops, aggressive mode ends for good.

Deviation from the reference, on purpose: during an encoder-only update the decoder's weights
get no gradients (they are not stepped, so computing them is wasted work; the decoder still
passes gradients through to z), and gradient clipping is applied to the gradients of the
module being stepped. The reference clips the joint norm of encoder AND unused decoder
gradients, so its encoder step size depends on gradients it throws away. With decoder gradient
norms 30-90x the encoder's (docs/metrics.md, aggressive training), that clip shrinks the reference's encoder steps
(by ~0.4x at clip 5), so the default takes larger encoder steps than He et al. did;
`clip="joint"` reproduces the reference's steps exactly, at the cost of the decoder gradients.
"""

from __future__ import annotations

import random
from typing import Literal

import torch

from seqvae.options import AT_LEAST_ONE
from seqvae.store.strategies import strategy
from seqvae.text.corpus import run_seed


class WindowStopRule:
    """He et al.'s stop rule: every `window` steps, compare the loss per word of the last window
    with the previous window's; stop when it rose. The first window is compared with 1e4."""

    def __init__(self, window: int = 15):
        self.window = window
        self.previous = 1e4
        self.loss_sum = 0.0
        self.words = 0
        self.steps = 0

    def update(self, loss_sum: float | torch.Tensor, words: int | torch.Tensor) -> bool:
        """Adds one step's summed loss and word count; True when the loop must stop now."""
        self.loss_sum = self.loss_sum + loss_sum
        self.words = self.words + words
        self.steps += 1
        if self.steps % self.window:
            return False
        current = float(self.loss_sum) / float(self.words)  # the only host sync: once a window
        self.loss_sum, self.words = 0.0, 0
        if self.previous - current < 0:
            return True
        self.previous = current
        return False


@strategy
class AggressiveTraining:
    """Turns on aggressive encoder training (He et al. 2019).

    Args:
        max_inner_steps: Encoder updates per batch at most (the reference's `sub_iter < 100`: 99).
        window: Steps per window of the stop rule (15).
        seed: Seed of the random inner batches; default: the run's `seed_everything`.
        clip: "stepped": clip the gradient norm of the module being stepped (default);
            "joint": clip the norm of encoder and decoder gradients together, as the reference.
    """

    # 0 inner steps would never step the encoder while aggressive; the stop rule's window is a
    # modulus (0: ZeroDivisionError at the first batch).
    option_ranges = {"max_inner_steps": AT_LEAST_ONE, "window": AT_LEAST_ONE}

    def __init__(
        self, max_inner_steps: int = 99, window: int = 15, seed: int | None = None, clip: Literal["stepped", "joint"] = "stepped"
    ):
        if clip not in ("stepped", "joint"):
            raise ValueError(f"model.aggressive.clip: {clip!r} is not 'stepped' or 'joint'")
        if seed is None:
            seed = run_seed()
        self.max_inner_steps, self.window, self.seed, self.clip = max_inner_steps, window, seed, clip
        self.active = True
        self.previous_mi = 0.0  # the reference starts from 0: a first epoch with MI < 0 ends it
        self.rng = random.Random(seed)

    def train_encoder(self, module, batch: dict[str, torch.Tensor], kl_weight: float) -> int:
        """Runs the inner loop; returns the number of encoder updates made."""
        rule = WindowStopRule(self.window)
        datamodule = module.trainer.datamodule
        inner = batch
        for step in range(1, self.max_inner_steps + 1):
            terms = module.update_step(inner, kl_weight, stepped=module.encoder, clip_joint=self.clip == "joint")
            n = inner["tokens"].size(0)
            stop = rule.update(terms["loss"] * n, (inner["lengths"] - 1).sum())
            if stop or step == self.max_inner_steps:
                return step
            inner = datamodule.random_train_batch(self.rng)
            if module.device.type == "cuda":  # page-locked: the copy does not wait for the queued steps
                inner = {k: v.pin_memory() for k, v in inner.items()}
            inner = {k: v.to(module.device, non_blocking=True) for k, v in inner.items()}
        return self.max_inner_steps

    def end_epoch(self, mi: float) -> bool:
        """Called with the epoch's validation MI; returns True if aggressive mode just ended."""
        if not self.active:
            return False
        ended = mi - self.previous_mi < 0
        self.previous_mi = mi
        if ended:
            self.active = False
        return ended

    # Pickled into the checkpoint's hyper-parameters: only the configuration, so that it loads
    # under torch.load(weights_only=True); the run state travels in state_dict().
    def __getstate__(self) -> dict:
        return {"max_inner_steps": self.max_inner_steps, "window": self.window, "seed": self.seed, "clip": self.clip}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def state_dict(self) -> dict:
        return {"active": self.active, "previous_mi": self.previous_mi, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.active, self.previous_mi = state["active"], state["previous_mi"]
        self.rng.setstate(state["rng"])
