"""The training step's reads of device values, gathered at the logging interval (issue 46).

On a GPU every read of a tensor's value by the host (`bool(t)`, `float(t)`, a Python number
logged, which Lightning copies to the device) waits for all the work queued before it: ~2-4 ms
of host time per paper-size step on ~6 ms of GPU work. Where the device plan says so
(`core/chunking.py`: on CUDA), the finite check of every update stays on the device and is read
once per logging interval (`trainer.log_every_n_steps`, and at an epoch's last batch), as are the
logged values. A non-finite update is still never applied: its gradients are zeroed on the
device (SGD then leaves the weights as they were), and the run stops at the next read, naming
the first such update. On the CPU a read costs nothing and the check stays per update.
"""

from __future__ import annotations

import torch


class DeferredFiniteCheck:
    """Non-finite updates, recorded on the device: the first one's update number and which of
    its values were non-finite."""

    def __init__(self):
        self.first_bad: torch.Tensor | None = None  # () int64: the update number, -1 while all finite
        self.bad_values: torch.Tensor | None = None  # (n,) bool: which values the first was non-finite in
        self.names: list[str] = []

    def add(self, values: torch.Tensor, names: list[str], update: int, grads: list[torch.Tensor]) -> None:
        """`values` (n,), named `names`, of update `update`; zeroes `grads` in place when any is non-finite."""
        self.names = names
        finite = torch.isfinite(values)
        ok = finite.all()
        if self.first_bad is None or self.bad_values is None or self.bad_values.shape != values.shape:
            self.first_bad = torch.full((), -1, dtype=torch.long, device=values.device)
            self.bad_values = torch.zeros_like(finite)
        first = (self.first_bad < 0) & ~ok
        self.first_bad = torch.where(first, update, self.first_bad)
        self.bad_values = torch.where(first, ~finite, self.bad_values)
        for g in grads:
            g.masked_fill_(~ok, 0.0)  # the whole gradient, NaNs included: SGD makes no change

    def read(self) -> tuple[int, list[int]] | None:
        """(first non-finite update, indices of its non-finite values), or None: one host read."""
        if self.first_bad is None:
            return None
        first = int(self.first_bad)
        return None if first < 0 else (first, torch.nonzero(self.bad_values).flatten().tolist())

    def raise_if_any(self, module, error: type[Exception]) -> None:
        """Raises `error` naming the first non-finite update of `module`'s run, if there was one."""
        bad = self.read()
        if bad is not None:
            raise error(
                f"non-finite {', '.join(self.names[i] for i in bad[1])} at update {bad[0]} (epoch "
                f"{module.trainer.current_epoch}, read at update {module.num_updates}); no non-finite update "
                "was applied, the last checkpoint is kept"
            )


def logging_now(trainer, batch_idx: int) -> bool:
    """Whether Lightning writes this training step's logged values (its own test, every
    `log_every_n_steps`), or the step is its epoch's last (the epoch line reads the values)."""
    last = batch_idx + 1 >= trainer.num_training_batches
    return last or trainer.should_stop or trainer._logger_connector.should_update_logs
