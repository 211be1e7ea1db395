"""The LightningCLI of `seqvae fit/validate/test/predict`: parsing, checks and wiring.
(`seqvae.commands.main` is the entry point and sends the tools elsewhere; `python -m
seqvae.cli fit …`, as sweeps run it, goes straight to `run_lightning`.)

A run directory is the contract: `<save_dir>/<name>/<version>/` holds `config.yaml`,
`hparams.yaml`, `vocab.json`, TensorBoard events, `checkpoints/{best,last}.ckpt` and
`metrics.json` (test metrics of the best checkpoint). `fit` tests the best checkpoint itself.
seqvae/rundir writes them: files.py (names, atomic writes), callbacks.py (config, vocabulary,
checkpoints, per-text values), results.py (metrics.json, per_text.csv, curves.csv,
predictions.txt); guards.py refuses what would write into the wrong one.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

from jsonargparse import ArgumentError, lazy_instance, set_parsing_settings
from lightning_fabric.plugins import TorchCheckpointIO
from omegaconf.errors import OmegaConfBaseException
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import TensorBoardLogger

from seqvae.config_sources import check_config_files, file_setting, integer_limits, set_by_user, settle_seeds, settle_splits
from seqvae.core.generation import check_predict_inputs, predicted_lines, read_predict_inputs
from seqvae.core.model import AGGRESSIVE_DDP, NonFiniteError, SeqVAE, pretrained_encoder
from seqvae.errors import ConfigError, CorpusError, class_option_error, union_choice_error, unrecognized_option_hint
from seqvae.options import check_parsed
from seqvae.rundir.guards import (
    beside_a_finished_run,
    check_checkpoint_file,
    check_logger,
    fit_checkpoint,
    not_a_finished_run,
)
from seqvae.rundir.results import fit_totals, write_fit_curves, write_predictions, write_test_results
from seqvae.rundir.run_dir_callbacks import PerTextRows, RunCheckpoint, RunDirConfig
from seqvae.store.checkpoints import unshare
from seqvae.store.files import BEST
from seqvae.text.datamodule import TextDataModule
from seqvae.text.hints import report_data
from seqvae.training.allocator import reuse_freed_memory
from seqvae.training.callbacks import AtomicCheckpointIO, LatentDimensions, PeriodicCheckpoint, PlateauRule, TextSamples
from seqvae.training.log_lines import EpochLine, TestProgress
from seqvae.training.precision import MatmulPrecision
from seqvae.training.resume import check_resume, same_vocabulary
from seqvae.training.retest import checkpoint_into_config, record_checkpoint_settings

DEFAULTS = {
    "checkpoint.monitor": "val/loss",
    "checkpoint.filename": BEST,
    "checkpoint.save_last": True,
    "checkpoint.auto_insert_metric_name": False,
    "trainer.logger": lazy_instance(TensorBoardLogger, save_dir="runs", name="default", default_hp_metric=False),
    # A progress bar in a terminal; else (logs, CI, sweep cells) one line per epoch (EpochLine).
    "trainer.enable_progress_bar": sys.stderr.isatty(),
    # TextDataModule shards its own batch samplers across DDP ranks.
    "trainer.use_distributed_sampler": False,
}


class SeqVAECLI(LightningCLI):
    """Parses and wires: the run directory's guards (rundir/guards.py), the data lines
    (text/hints.py), the checkpoint's settings (training/retest.py, training/resume.py) and the
    result files (rundir/results.py) live where their room is; this class calls them in order."""

    def __init__(self, args=None, run=True):
        # omegaconf+: `${model.hidden_dim}` resolves after every --config file and option is merged (an overlay may refer
        # to a key another file or the command line sets); paths as written from a file's top (`model.…`, not `fit.model.…`).
        set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
        try:
            super().__init__(
                SeqVAE,
                TextDataModule,
                save_config_callback=RunDirConfig,
                parser_kwargs={"parser_mode": "omegaconf+", "exit_on_error": False, "allow_abbrev": False},
                seed_everything_default=1,
                args=args,
                run=run,
            )
        finally:
            unshare()  # the one read of --ckpt_path (training/retest.py) is not kept past the command

    def _parse_ckpt_path(self):
        self.config, self._given_model = checkpoint_into_config(self.parser, self.config)

    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults(DEFAULTS)
        parser.add_lightning_class_args(PlateauRule, "plateau")
        parser.add_lightning_class_args(PeriodicCheckpoint, "periodic_checkpoint")
        parser.add_lightning_class_args(TextSamples, "text_samples")
        parser.add_lightning_class_args(LatentDimensions, "latent_dimensions")
        parser.add_lightning_class_args(MatmulPrecision, "matmul")  # TF32 on CUDA (training/precision.py)

    def parse_arguments(self, parser, args):
        self._command_line = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:] if args is None else []
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise with_nearest_option(err, parser, self._command_line) from None
        check_seed(self.config)

    def before_instantiate_classes(self):
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        check_checkpoint_file(cfg.get("ckpt_path"), self.subcommand)
        if cfg.get("model") is not None and cfg.get("data") is not None:
            check_parsed(cfg["model"], cfg["data"])  # an out-of-range number stops before any data file is read
        check_logger(cfg)
        for line in settle_splits(cfg["data"], self._command_line) if cfg.get("data") is not None else ():
            print(line, file=sys.stderr)
        if self.subcommand in ("validate", "test", "predict"):
            record_checkpoint_settings(cfg, lambda key: set_by_user(self._command_line, key), self._given_model)
            self._beside = beside_a_finished_run(cfg, self.subcommand)  # said with the data lines, once the inputs pass
        settle_seeds(cfg)

    def instantiate_trainer(self, **kwargs):
        # `limit_*_batches: 1` is one batch, not the 100% that jsonargparse's float 1.0 means to Lightning.
        trainer = super().instantiate_trainer(**{**integer_limits(self._command_line), **kwargs})
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # reads through the one loader, writes atomic
            trainer.strategy.checkpoint_io = AtomicCheckpointIO()
        trainer.callbacks.append(PerTextRows())
        return trainer

    def before_validate(self):
        self.datamodule.read_splits(["val"])  # a bad file stops here, before the run directory exists
        report_data(self.trainer, self.datamodule, ("val",), getattr(self, "_beside", None))

    def before_test(self):
        self.datamodule.read_splits(["test"])
        report_data(self.trainer, self.datamodule, ("test",), getattr(self, "_beside", None))
        if not self.trainer.progress_bar_callback:
            self.trainer.callbacks.append(TestProgress())

    def before_predict(self):
        splits = read_predict_inputs(self.model, self.datamodule)
        check_predict_inputs(self.model, self.datamodule)
        if self.trainer.world_size > 1:  # before Lightning launches the other ranks: one line, not a rank crash
            raise ConfigError("trainer.strategy/devices: predict runs on one device (it writes one file in input order)")
        report_data(self.trainer, self.datamodule, splits, getattr(self, "_beside", None))

    def before_fit(self):
        ckpt = fit_checkpoint(self.config_init["fit"].get("ckpt_path"), self.trainer.log_dir)
        if ckpt and Path(ckpt).is_file():
            same_vocabulary(ckpt, self.datamodule.vocab)
            check_resume(self._subcommand_parsers["fit"], self.config["fit"], ckpt)  # other settings: refused
            not_a_finished_run(self.trainer.log_dir)  # extended elsewhere, not in place
        if self.model.hparams.init_encoder_from and self.model.encoder is not None:  # refused before the run directory exists
            pretrained_encoder(self.model.hparams.init_encoder_from, self.model.encoder, self.datamodule.vocab, mmap=True)
        if self.trainer.world_size > 1 and self.model.aggressive is not None:
            raise ConfigError(AGGRESSIVE_DDP)
        if self.trainer.fast_dev_run and self.trainer.checkpoint_callback is not None:
            # fast_dev_run promises no checkpoints, but Lightning 2.6's ModelCheckpoint still writes
            # last.ckpt in on_train_end, into ./checkpoints (a smoke test must leave nothing behind).
            self.trainer.checkpoint_callback.save_last = False
        if not self.trainer.progress_bar_callback:
            self.trainer.callbacks += [EpochLine(), TestProgress()]
        for cb in (cb for cb in self.trainer.callbacks if isinstance(cb, RunDirConfig)):
            cb.resuming = bool(self.config_init["fit"].get("ckpt_path"))
        for split in ("train", "val", "test"):  # read now if data.vocab deferred them: errors before any file
            self.datamodule.split_ids(split)
        report_data(self.trainer, self.datamodule, ("train", "val", "test"))

    def after_fit(self):
        if not self.trainer.interrupted:  # fit tests its best checkpoint: metrics.json, per_text.csv, curves.csv
            totals = fit_totals(self.trainer, self.model)
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best" if totals["best_checkpoint"] else None)
            self._write_results(totals)
            write_fit_curves(self.trainer)

    def after_test(self):
        self._write_results({"checkpoint": self.config_init[self.subcommand].get("ckpt_path")})

    def after_predict(self):
        lines = predicted_lines(self.trainer.predict_loop.predictions, self.model, self.datamodule)
        write_predictions(self.trainer, self.model.generation, *lines)

    def _write_results(self, extra: dict):
        seed = self.config[self.subcommand].get("seed_everything")
        write_test_results(self.trainer, self.model, self.datamodule, seed, self._command_line, extra)


class _KnownNoise(logging.Filter):
    """Lines by their start: an advertisement; hardware this machine does not have; the seed, which
    seqvae's own line says (`text/hints.py`: "vocabulary N ids; seed S; run directory …"). Before, a
    refusal after Lightning started came as three or four lines, the error last (a new user's report)."""

    NOISE = ("💡 Tip:", "GPU available: False, used: False", "TPU available: False", "HPU available: False", "Seed set to ")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


def quiet_known_noise() -> None:
    """Silences, by their text, the lines Lightning prints on every command that say nothing
    about the run (`_KnownNoise`) and the FutureWarning of Lightning's own use of torch's
    deprecated LeafSpec (fixed in Lightning, not ours to act on). Real warnings stay."""
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.seed"):
        logging.getLogger(name).addFilter(_KnownNoise())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


class _Parsed(Exception):
    """Stops `parse_only` once the arguments are parsed, before anything is built."""


class _ParseOnly(SeqVAECLI):
    def _set_seed(self):  # no global seeding in the caller's process
        pass

    def before_instantiate_classes(self):
        config = self.config[self.subcommand]
        check_parsed(config.model, config.data)
        raise _Parsed


def check_seed(config) -> None:
    """seed_everything out of range: one line, before Lightning's traceback."""
    cfg = config[config["subcommand"]] if config.get("subcommand") else config
    seed = cfg.get("seed_everything")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
        raise ConfigError(f"seed_everything: must be in [0, 2**32 - 1], got {seed}")


def with_nearest_option(err: ArgumentError, parser, argv: list[str]) -> ArgumentError:
    """argparse's "unrecognized arguments: --model.hiden_dim 3" with the nearest option the
    subcommand knows (`did you mean --model.hidden_dim?`); any other error as it is."""
    if "unrecognized arguments" not in str(err):
        return err
    subcommands = parser._subcommands_action  # the subcommand's own parser knows its keys
    named = next((a for a in argv if subcommands and a in subcommands._name_parser_map), None)
    keys = list((subcommands._name_parser_map[named] if named else parser).get_defaults().keys())
    return ArgumentError(None, unrecognized_option_hint(str(err), keys))


def interpolation_error(err: OmegaConfBaseException, argv: list[str]) -> str:
    """An ${…} interpolation that does not resolve, in one line naming the key and its --config file."""
    key = re.sub(r"^(fit|validate|test|predict)\.", "", str(getattr(err, "full_key", "") or ""))
    detail = re.sub(r"'(fit|validate|test|predict)\.", "'", str(err).splitlines()[0])
    written_in = file_setting(argv, key) if key else None
    return f"{key or 'config'}: {detail}" + (f" (in --config {written_in})" if written_in else "")


def parse_only(fit_args: list[str]) -> str | None:
    """`seqvae fit` arguments parsed as the CLI parses them (config files, unknown keys, wrong
    types and choices, out-of-range numbers) without building the model or reading data: the
    one-line error, or None."""
    try:
        check_config_files(fit_args)
        with warnings.catch_warnings():  # Lightning's note that the caller's own sys.argv is ignored: it is meant to be
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            _ParseOnly(args=["fit", *fit_args])
    except _Parsed:
        return None
    except (CorpusError, ArgumentError, ConfigError) as err:
        message = " ".join(str(err).split())
        return class_option_error(message) or union_choice_error(message) or message
    except OmegaConfBaseException as err:
        return interpolation_error(err, fit_args)
    return None


def run_lightning(argv: list[str] | None = None) -> None:
    """fit/validate/test/predict (`seqvae.commands.main` sends everything else elsewhere)."""
    reuse_freed_memory()  # ~a quarter less CPU time per training step on glibc (seqvae/training/allocator.py)
    quiet_known_noise()
    given = list(argv) if argv is not None else sys.argv[1:]
    try:
        check_config_files(given)
        SeqVAECLI(args=argv)
    except OmegaConfBaseException as err:
        print(f"seqvae: error: {interpolation_error(err, given)}", file=sys.stderr)
        sys.exit(2)
    except (CorpusError, ArgumentError, ConfigError, NonFiniteError) as err:
        message = " ".join(str(err).split())  # one line, whatever jsonargparse nested
        message = class_option_error(message) or union_choice_error(message) or message
        # The messages name the key, not the --config file that set it (unknown key, wrong type, out of range):
        # add the file, unless the command line set the key too (its value is the one refused).
        found = re.search(
            r"does not accept option '([\w.]+)'|^Parser key \"([\w.]+)\"|^((?:model|data|trainer)\.[\w.]+):", message
        )
        key = next((k for k in found.groups() if k), None) if found else None
        written_in = file_setting(given, key) if key else None
        if written_in is not None and not any(a == f"--{key}" or a.startswith(f"--{key}=") for a in given):
            message += f" (in --config {written_in})"
        print(f"seqvae: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_lightning()
