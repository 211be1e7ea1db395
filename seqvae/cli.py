"""The LightningCLI of `seqvae fit/validate/test/predict`: parsing, checks and wiring.
(`seqvae.commands.main` is the entry point and sends the tools elsewhere; `python -m
seqvae.cli fit …`, as sweeps run it, goes straight to `run_lightning`.)

A run directory is the contract: `<save_dir>/<name>/<version>/` holds `config.yaml`,
`hparams.yaml`, `vocab.json`, TensorBoard events, `checkpoints/{best,last}.ckpt` and
`metrics.json` (test metrics of the best checkpoint). `fit` tests the best checkpoint itself.
seqvae/rundir writes them: files.py (names, atomic writes), callbacks.py (config, vocabulary,
checkpoints), results.py (metrics.json, per_text.csv, curves.csv, predictions.txt).
"""

from __future__ import annotations

import logging
import re
import sys
import warnings
from pathlib import Path

from jsonargparse import ArgumentError, lazy_instance, set_parsing_settings
from omegaconf.errors import OmegaConfBaseException
from pytorch_lightning.cli import LightningCLI
from pytorch_lightning.loggers import TensorBoardLogger

from seqvae.config_sources import check_config_files, file_setting, integer_limits, set_by_user, settle_splits
from seqvae.core.generation import check_predict_inputs, lines_of_file
from seqvae.core.model import AGGRESSIVE_DDP, NonFiniteError, SeqVAE, pretrained_encoder
from seqvae.errors import ConfigError, CorpusError, union_choice_error
from seqvae.options import check_parsed
from seqvae.rundir.results import write_fit_curves, write_predictions, write_test_results
from seqvae.rundir.run_dir_callbacks import RunCheckpoint, RunDirConfig
from seqvae.store.checkpoints import load_checkpoint
from seqvae.store.files import BEST, CONFIG, LAST, checkpoint_path
from seqvae.text.corpus import Vocabulary
from seqvae.text.datamodule import TextDataModule
from seqvae.text.hints import data_line, fallback_warnings, unk_rate_hint
from seqvae.training.allocator import reuse_freed_memory
from seqvae.training.callbacks import LatentDimensions, PeriodicCheckpoint, PlateauRule, TextSamples
from seqvae.training.log_lines import EpochLine, TestProgress
from seqvae.training.precision import MatmulPrecision
from seqvae.training.resume import check_resume
from seqvae.training.retest import record_checkpoint_settings


class SeqVAECLI(LightningCLI):
    def __init__(self, args=None, run=True):
        # omegaconf+: `${model.hidden_dim}` resolves after every --config file and option is merged, so an
        # overlay file may refer to a key another file (or the command line) sets; paths stay as written
        # from a config file's own top (`model.…`, not `fit.model.…`).
        set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
        super().__init__(
            SeqVAE,
            TextDataModule,
            save_config_callback=RunDirConfig,
            parser_kwargs={"parser_mode": "omegaconf+", "exit_on_error": False, "allow_abbrev": False},
            seed_everything_default=1,
            args=args,
            run=run,
        )

    # Evaluation settings, not part of what a checkpoint is: on `--ckpt_path` (validate, test, predict), Lightning
    # replaces the model's config with the checkpoint's hyper-parameters, which would silently evaluate with the K
    # the run was trained with. These keys keep the value of this command's config (--config files, --model.*).
    EVAL_KEYS = ("val_iw_samples", "test_iw_samples", "iw_max_elements", "mi_dataset", "eval_seed", "ais")

    def _parse_ckpt_path(self):
        sub = self.config.get("subcommand")
        model = self.config[sub].get("model") if sub else None
        keep = {k: model.get(k) for k in self.EVAL_KEYS if k in model} if model is not None else {}
        self._given_model = model.clone() if model is not None else None  # before the checkpoint's values replace it
        ckpt = self.config[sub].get("ckpt_path") if sub else None
        if ckpt and Path(ckpt).is_file():
            load_checkpoint(ckpt, "ckpt_path", mmap=True)  # refuses a code-carrying file in one line
        if sub == "fit":  # a resume runs the command's settings, refused where they differ (training/resume.py)
            return
        super()._parse_ckpt_path()
        for k, v in keep.items():
            self.config[sub]["model"][k] = v

    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")
        parser.add_lightning_class_args(RunCheckpoint, "checkpoint")
        parser.set_defaults(
            {
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
        )
        parser.add_lightning_class_args(PlateauRule, "plateau")
        parser.add_lightning_class_args(PeriodicCheckpoint, "periodic_checkpoint")
        parser.add_lightning_class_args(TextSamples, "text_samples")
        parser.add_lightning_class_args(LatentDimensions, "latent_dimensions")
        parser.add_lightning_class_args(MatmulPrecision, "matmul")  # TF32 on CUDA (training/precision.py)

    def parse_arguments(self, parser, args):
        self._command_line = list(args) if isinstance(args, (list, tuple)) else sys.argv[1:] if args is None else []
        super().parse_arguments(parser, args)
        cfg = self.config[self.config["subcommand"]] if self.config.get("subcommand") else self.config
        seed = cfg.get("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:  # before Lightning's traceback
            raise ConfigError(f"seed_everything: must be in [0, 2**32 - 1], got {seed}")

    def _beside_a_finished_run(self, cfg) -> None:
        """validate/test/predict with a run's own config.yaml, whose logger names the run's fixed
        version (every sweep cell's does), would write into that finished run (Lightning refuses
        with a traceback, after adding an events file to it): such a command writes to the next
        free version_N beside it instead, and says so."""
        logger = (cfg.get("trainer") or {}).get("logger")
        args = getattr(logger, "init_args", None)
        version = args.get("version") if args is not None else None
        if version is None or not args.get("save_dir"):
            return
        run = Path(args.save_dir, args.get("name") or "", version if isinstance(version, str) else f"version_{version}")
        if (run / CONFIG).exists():
            args["version"] = None
            note = f"seqvae: {run} holds a finished run: this {self.subcommand} writes to a new version_N beside it"
            print(note, file=sys.stderr)

    def before_instantiate_classes(self):
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        # Before the data are read: a missing checkpoint would otherwise surface as whatever the
        # data module misses without it (the vocabulary it was to give, the training text).
        ckpt = cfg.get("ckpt_path")
        if ckpt and ckpt not in ("best", "last", "hpc", "registry") and not Path(ckpt).is_file():
            if Path(ckpt).is_dir():
                raise ConfigError(f"ckpt_path: {ckpt} is a directory, not a checkpoint file")
            raise ConfigError(f"ckpt_path: no such checkpoint file {ckpt}")
        if cfg.get("model") is not None and cfg.get("data") is not None:
            check_parsed(cfg["model"], cfg["data"])  # an out-of-range number stops before any data file is read
        self._check_save_dir(cfg)
        if cfg.get("data") is not None:
            for line in settle_splits(cfg["data"], self._command_line):
                print(line, file=sys.stderr)
        if self.subcommand in ("validate", "test", "predict"):
            record_checkpoint_settings(cfg, lambda key: set_by_user(self._command_line, key), self._given_model)
            self._beside_a_finished_run(cfg)
        # Seeds left unset take the run's seed (`seed_everything`), written into the config here
        # so that config.yaml records the values the run used.
        seed = cfg.get("seed_everything")
        if not isinstance(seed, int) or isinstance(seed, bool):
            seed = 0
        if cfg.get("data") is not None and cfg["data"].get("seed") is None:
            cfg["data"]["seed"] = seed
        aggressive = cfg["model"].get("aggressive") if cfg.get("model") is not None else None
        if aggressive is not None and aggressive.get("init_args") is not None and aggressive["init_args"].get("seed") is None:
            aggressive["init_args"]["seed"] = seed

    @staticmethod
    def _check_save_dir(cfg) -> None:
        """A logger directory under a file (`save_dir: notes.txt`) is refused in one line before
        any data is read (it surfaced as NotADirectoryError after the data and a run line)."""
        logger = (cfg.get("trainer") or {}).get("logger")
        args = getattr(logger, "init_args", None)
        save_dir = args.get("save_dir") if args is not None else None
        if not save_dir:
            return
        for path in (Path(save_dir), *Path(save_dir).parents):
            if path.exists() and not path.is_dir():
                raise ConfigError(f"trainer.logger.init_args.save_dir: {path} is a file, not a directory (save_dir {save_dir})")

    def instantiate_trainer(self, **kwargs):
        # `limit_*_batches: 1` is one batch, not the 100% that jsonargparse's float 1.0 means to Lightning.
        return super().instantiate_trainer(**{**integer_limits(self._command_line), **kwargs})

    def _refuse_a_finished_run_directory(self) -> None:
        """`fit` into a run directory that already holds a run, without `--ckpt_path` to resume it:
        refused here, before Lightning writes anything there (its own refusal came after a new
        TensorBoard events file was added to the old run)."""
        log_dir = self.trainer.log_dir
        if log_dir and (Path(log_dir) / CONFIG).exists():
            last = checkpoint_path(log_dir, LAST)
            raise ConfigError(
                f"trainer.logger.init_args.version: {log_dir} already holds a run (config.yaml): give another "
                f"version (or none: the next free one), or resume it with --ckpt_path {last}"
            )

    def _same_vocabulary(self, ckpt: str) -> None:
        """Resuming with other training text builds another vocabulary, whose embedding sizes
        cannot load the checkpoint's weights: one line instead of a state-dict size mismatch."""
        saved = load_checkpoint(ckpt, "ckpt_path", mmap=True).get("vocab")
        saved = Vocabulary.from_str(saved).tokenizer.get_vocab() if saved is not None else None
        now = self.datamodule.vocab.tokenizer.get_vocab()
        if saved is not None and saved != now:
            moved = sum(1 for word, i in saved.items() if now.get(word) != i)  # missing, or at another id
            raise ConfigError(
                f"ckpt_path: {ckpt} was trained with another vocabulary ({len(saved)} ids) than data.train gives now "
                f"({len(now)} ids; {moved} of the checkpoint's words missing or at other ids): resume with the "
                "training data (and data.* options) the run started with"
            )

    def _report_data(self, splits) -> None:
        """The data lines `fit`, `validate` and `test` print: texts, tokens, unk rate, skipped lines,
        and the warnings of a split read with another unknown token or from another corpus."""
        dm = self.datamodule
        if not self.trainer.is_global_zero:
            return
        summary = dm.summary()
        for split in splits:
            print(data_line(split, summary[split]), file=sys.stderr)
        if "train" not in splits:  # scoring a checkpoint: its vocabulary's unknown token
            for split in splits:
                dm.unk_hint(split)
        train_rate = summary["train"]["unk_rate"] if "train" in summary else (dm.vocab.reading or {}).get("train_unk_rate")
        for split in splits:
            hint = unk_rate_hint(split, summary[split], train_rate) if split != "train" else None
            if hint is not None:
                print(f"seqvae: warning: {hint}", file=sys.stderr)
        print(f"seqvae: vocabulary {dm.vocab_size} ids; run directory {self.trainer.log_dir}", file=sys.stderr)

    def before_validate(self):
        self.datamodule.read_splits(["val"])  # a bad file stops here, before the run directory exists
        self._report_data(("val",))

    def before_test(self):
        self.datamodule.read_splits(["test"])
        self._report_data(("test",))
        if not self.trainer.progress_bar_callback:
            self.trainer.callbacks.append(TestProgress())

    def before_predict(self):
        dm = self.datamodule
        dm.prior_only = self.model.generation.mode == "sample"
        if not dm.prior_only and (dm.hparams.predict or dm.splits["test"] is not None):
            # A bad input file stops here, before the run directory exists.
            dm.predict_corpus() if dm.hparams.predict else dm.read_splits(["test"])
            self._report_data(("predict",) if dm.hparams.predict else ("test",))
        check_predict_inputs(self.model, dm)
        # Before Lightning launches the other ranks, so a single clear line, not a rank crash.
        if self.trainer.world_size > 1:
            raise ConfigError("trainer.strategy/devices: predict runs on one device (it writes one file in input order)")

    def before_fit(self):
        ckpt = self.config_init["fit"].get("ckpt_path")
        if ckpt == "last":
            # Lightning's "last": this run directory's last.ckpt. Found here, so that it gets the
            # vocabulary check; where there is none Lightning would train from scratch, only warning.
            last = checkpoint_path(self.trainer.log_dir or ".", LAST)
            if not last.is_file():
                raise ConfigError(
                    f"ckpt_path: last: no {last} to resume (name the run with trainer.logger.init_args.version, "
                    "or give the checkpoint's path)"
                )
            ckpt = str(last)
        if not ckpt:
            self._refuse_a_finished_run_directory()
        elif Path(ckpt).is_file():
            self._same_vocabulary(ckpt)
            check_resume(self._subcommand_parsers["fit"], self.config["fit"], ckpt)  # other settings: refused
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
        resuming = bool(self.config_init["fit"].get("ckpt_path"))
        for cb in (cb for cb in self.trainer.callbacks if isinstance(cb, RunDirConfig)):
            cb.resuming = resuming
        for split in ("train", "val", "test"):  # read now if data.vocab deferred them: errors before any file
            self.datamodule.split_ids(split)
        self._report_data(("train", "val", "test"))
        if self.trainer.is_global_zero:
            for line in fallback_warnings(self.datamodule.splits):
                print(f"seqvae: warning: {line}", file=sys.stderr)

    def after_fit(self):
        if self.trainer.interrupted:
            return
        m = self.model
        totals = {
            "updates": m.num_updates,
            "encoder_updates": m.encoder_updates,
            "decoder_updates": m.decoder_updates,
            "fit_seconds": round(m.fit_seconds, 1),
            "epochs": self.trainer.current_epoch,
        }
        best = self.trainer.checkpoint_callback.best_model_path or None
        self.trainer.test(m, datamodule=self.datamodule, ckpt_path="best" if best else None)
        self._write_metrics({**totals, "best_checkpoint": best})
        write_fit_curves(self.trainer)  # the validation curves, for `seqvae compare --plots`

    def after_test(self):
        self._write_metrics({"checkpoint": self.config_init[self.subcommand].get("ckpt_path")})

    def after_predict(self):
        """The generated texts (`model.generation`) to predictions.txt (seqvae/rundir/results.py);
        a reconstruction of a file gets one line per input line (empty where it had no text)."""
        lines = [t for batch in self.trainer.predict_loop.predictions for t in batch]
        generation = self.model.generation
        n_texts, blank = len(lines), ""
        source = self.datamodule.predict_source() if generation.mode == "reconstruct" else None
        if source is not None and len(lines) == len(source.texts):
            lines = lines_of_file(lines, source)
            if len(lines) > n_texts:
                blank = f"; {len(lines) - n_texts} empty lines for input lines without a text to reconstruct"
        write_predictions(self.trainer, generation, lines, n_texts, blank)

    def _write_metrics(self, extra: dict):
        """metrics.json + per_text.csv of this test (seqvae/rundir/results.py)."""
        seed = self.config[self.subcommand].get("seed_everything")
        write_test_results(self.trainer, self.model, self.datamodule, seed, self._command_line, extra)


class _NoAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_known_noise() -> None:
    """Silences, by their exact text, the lines Lightning prints on every command that say nothing
    about the run: its LitLogger advertisement and the FutureWarning of Lightning's own use of
    torch's deprecated LeafSpec (fixed in Lightning, not ours to act on). Real warnings stay."""
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(_NoAdverts())
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
        return union_choice_error(" ".join(str(err).split())) or " ".join(str(err).split())
    except OmegaConfBaseException as err:
        return interpolation_error(err, fit_args)
    return None


def run_lightning(argv: list[str] | None = None) -> None:
    """fit/validate/test/predict (`seqvae.commands.main` sends everything else elsewhere)."""
    reuse_freed_memory()  # a third less CPU time per training step on glibc (seqvae/allocator.py)
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
        message = union_choice_error(message) or message
        # The messages name the key, not the --config file that set it (unknown key, wrong type, out of range):
        # add the file, unless the command line set the key too (its value is the one refused).
        found = re.search(r"does not accept option '([\w.]+)'|^Parser key \"([\w.]+)\"|^((?:model|data|trainer)\.[\w.]+):", message)
        key = next((k for k in found.groups() if k), None) if found else None
        written_in = file_setting(given, key) if key else None
        if written_in is not None and not any(a == f"--{key}" or a.startswith(f"--{key}=") for a in given):
            message += f" (in --config {written_in})"
        print(f"seqvae: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_lightning()
