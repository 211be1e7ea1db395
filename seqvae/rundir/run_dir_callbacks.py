"""The run directory's Lightning callbacks, as the CLI installs them: RunDirConfig (config.yaml
and vocab.json; a resumed run keeps its config), RunCheckpoint (`--checkpoint.*`: the
checkpoints/ of a run, moved run directories re-rooted) and PerTextRows (per_text.csv's values).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pytorch_lightning import Callback
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.cli import SaveConfigCallback

from seqvae.store.files import HPARAMS, VOCAB


class RunDirConfig(SaveConfigCallback):
    """Saves config.yaml and vocab.json in the run directory. A resumed run (`--ckpt_path`)
    keeps the config it started with, or records the settings a resume may change where it did."""

    resuming = False  # set by the CLI before `fit --ckpt_path`

    def setup(self, trainer, pl_module, stage):
        # `trainer.log_dir` broadcasts under DDP: read it here, on every rank, not in
        # save_config (rank 0 only), which would leave the other ranks waiting.
        self._log_dir = trainer.log_dir
        path = Path(self._log_dir or ".") / self.config_filename
        if self.resuming and self._log_dir and path.exists():
            # The CLI has refused every difference that changes what is computed (training/resume.py);
            # what is left (max_epochs, logging, …) is recorded: config.yaml is rewritten with the
            # resumed command's values. `ckpt_path` stays as the run started (a resume is not a setting).
            old = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
            config = self.config.clone()
            config["ckpt_path"] = old.get("ckpt_path")
            if yaml.safe_load(self.parser.dump(config, skip_none=False)) == old:
                self.already_saved = True
            else:
                self.config, self.overwrite = config, True
        super().setup(trainer, pl_module, stage)

    def save_config(self, trainer, pl_module, stage):
        if self.resuming and self.overwrite and self._log_dir:
            # The logger writes hparams.yaml only where there is none: removed, it is written anew
            # with the resumed values (`model.test_iw_samples`, …), so that it agrees with config.yaml.
            (Path(self._log_dir) / HPARAMS).unlink(missing_ok=True)
        dm = trainer.datamodule
        if self._log_dir and dm is not None and hasattr(dm, "vocab"):
            path = Path(self._log_dir) / VOCAB
            if not path.exists():
                dm.vocab.save(path)


class RunCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint (`--checkpoint.*`) that, when a checkpoint is only evaluated
    (test/validate/predict into a new run directory), leaves the training run's checkpoint
    bookkeeping alone instead of warning that its directory differs from this run's."""

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        self._fitting = stage == "fit"

    def load_state_dict(self, state_dict):
        if getattr(self, "_fitting", True):
            super().load_state_dict(self._moved(state_dict))

    def _moved(self, state_dict: dict) -> dict:
        """A run directory moved or copied elsewhere and resumed there: its checkpoint paths,
        re-rooted when every file they name is in the new directory. (Lightning keeps the old
        best path, so the next best checkpoint was written beside the old one as best-v1.ckpt.)
        Resuming another run's checkpoint into a new directory keeps Lightning's handling."""
        old, new = state_dict.get("dirpath"), self.dirpath
        if not old or not new or old == new:
            return state_dict

        def moved(path):
            return str(Path(new) / Path(path).relative_to(old)) if path and Path(path).is_relative_to(old) else path

        keys = ("best_model_path", "kth_best_model_path", "last_model_path")
        paths = [state_dict.get(k) for k in keys] + list(state_dict.get("best_k_models", {}))
        if not all(Path(moved(p)).is_file() for p in paths if p):
            return state_dict
        out = {k: moved(v) if k in keys else v for k, v in state_dict.items()}
        out["best_k_models"] = {moved(k): v for k, v in state_dict.get("best_k_models", {}).items()}
        out["dirpath"] = new
        return out

    def on_validation_end(self, trainer, pl_module):
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_always(trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_always(trainer)

    def _save_last_always(self, trainer) -> None:
        """last.ckpt is the run's latest state at every save point. Lightning (2.6) writes it only where
        it wrote a top-k checkpoint at the same step: with save_top_k=1 an epoch that did not improve
        val/loss left last.ckpt at the best epoch (or PeriodicCheckpoint's last mid-epoch save), so a
        finished run's "last checkpoint" could be an earlier epoch and a resume retrained from there.
        (Skipped where Lightning skips: not fitting, sanity check, fast_dev_run, this step saved.)"""
        if self.save_last and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    @property
    def state_key(self) -> str:
        # ModelCheckpoint's key: checkpoints written before this subclass resume with its state.
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)


class PerTextRows(Callback):
    """The per-text values of a test (per_text.csv; `results.write_test_results` reads `rows`),
    taken from the model's test metrics at the end of the test epoch: a callback's hook runs
    before the LightningModule's, which computes and resets them. Every DDP rank gathers all
    ranks' rows (a collective); rank 0 writes them."""

    rows: dict | None = None

    def on_test_epoch_start(self, trainer, pl_module):
        self.rows = None

    def on_test_epoch_end(self, trainer, pl_module):
        self.rows = {k: v.cpu() for k, v in pl_module.test_metrics.per_text_rows().items()}
