"""The run directory's guards, as the CLI calls them before anything is written: a checkpoint
path that names no file, a logger directory under a file, a finished run that `fit` would write
into (or `last` to resume where there is none), and validate/test/predict with a finished run's
own config.yaml, sent to the next free version beside it. Each refusal is one line (ConfigError)."""

from __future__ import annotations

from pathlib import Path

from seqvae.errors import ConfigError
from seqvae.store.files import CONFIG, LAST, METRICS, checkpoint_path

LIGHTNING_CHECKPOINTS = ("best", "last", "hpc", "registry")  # what Lightning resolves itself


def check_checkpoint_file(ckpt: str | None, subcommand: str | None = None) -> None:
    """Before the data are read: a missing checkpoint would otherwise surface as whatever the
    data module misses without it (the vocabulary it was to give, the training text). `last`,
    `best`, … name the checkpoints of the process's own fit: `validate`, `test` and `predict` run
    none, and Lightning then tested the untrained model (`last`, exit 0, a record saying `last`)
    or raised a traceback (`best`); with no ckpt_path at all they evaluated the untrained
    initialisation and wrote its record."""
    if not ckpt and subcommand in ("validate", "test", "predict"):  # Lightning would evaluate the initial weights
        raise ConfigError(
            f"ckpt_path: `{subcommand}` evaluates a trained model and none was given: add --ckpt_path "
            "RUN/checkpoints/best.ckpt (without it the weights are the untrained initialisation)"
        )
    if ckpt in LIGHTNING_CHECKPOINTS and subcommand in ("validate", "test", "predict"):
        raise ConfigError(
            f"ckpt_path: {ckpt!r} names a checkpoint of this command's own fit, and `{subcommand}` runs none: give the "
            f"file (RUN/checkpoints/{'best' if ckpt == 'best' else 'last'}.ckpt)"
        )
    if ckpt and ckpt not in LIGHTNING_CHECKPOINTS and not Path(ckpt).is_file():
        if Path(ckpt).is_dir():
            raise ConfigError(f"ckpt_path: {ckpt} is a directory, not a checkpoint file")
        raise ConfigError(f"ckpt_path: no such checkpoint file {ckpt}")


def _logger_args(cfg):
    logger = (cfg.get("trainer") or {}).get("logger")
    return getattr(logger, "init_args", None)


def check_logger(cfg) -> None:
    """A logger directory under a file (`save_dir: notes.txt`) is refused in one line before
    any data is read (it surfaced as NotADirectoryError after the data and a run line); so is a
    value of the wrong type for an option TensorBoardLogger passes on untyped to tensorboard's
    SummaryWriter (`max_queue abc`: a TypeError traceback from the writer's thread, after the
    run's version directory was made)."""
    args = _logger_args(cfg)
    if str(getattr((cfg.get("trainer") or {}).get("logger"), "class_path", "")).endswith("TensorBoardLogger"):
        _check_untyped_writer_options(args)
    save_dir = args.get("save_dir") if args is not None else None
    if not save_dir:
        return
    for path in (Path(save_dir), *Path(save_dir).parents):
        if path.exists() and not path.is_dir():
            raise ConfigError(f"trainer.logger.init_args.save_dir: {path} is a file, not a directory (save_dir {save_dir})")


def _check_untyped_writer_options(args) -> None:
    if not args:
        return
    import inspect

    from pytorch_lightning.loggers import TensorBoardLogger
    from torch.utils.tensorboard import SummaryWriter

    own = inspect.signature(TensorBoardLogger).parameters
    writer = inspect.signature(SummaryWriter).parameters
    for key, value in args.items():
        default = writer[key].default if key in writer and key not in own else None
        if isinstance(default, (int, float)) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"trainer.logger.init_args.{key}: expected a number; got {value!r} (tensorboard's SummaryWriter)")


def beside_a_finished_run(cfg, subcommand: str) -> str | None:
    """validate/test/predict with a run's own config.yaml, whose logger names the run's fixed
    version (every sweep cell's does), would write into that finished run (Lightning refuses
    with a traceback, after adding an events file to it): such a command writes to the next
    free version_N beside it instead. Returns the line that says so, for the CLI to print once
    the command's inputs have passed their checks (a refused command announces no directory)."""
    args = _logger_args(cfg)
    version = args.get("version") if args is not None else None
    if version is None or not args.get("save_dir"):
        return None
    run = Path(args.save_dir, args.get("name") or "", version if isinstance(version, str) else f"version_{version}")
    if (run / CONFIG).exists():
        args["version"] = None
        return f"seqvae: {run} holds a finished run: this {subcommand} writes to a new version_N beside it"
    return None


def not_a_finished_run(log_dir: str | None) -> None:
    """A resume writes into `log_dir`: refused when that run has finished (its metrics.json written). Resumed in place
    it would train and test again and write a second result set beside the first, and its metrics.json (what compare
    and export read) would then disagree with its config.yaml and checkpoints (found by a new-user test). Checked
    after the vocabulary and settings checks, so a resume that could not run anyway says why first."""
    if log_dir and (Path(log_dir) / METRICS).is_file():
        raise ConfigError(
            f"ckpt_path: {log_dir} is a finished run (metrics.json): it is not resumed in place; to train it "
            f"further, give another trainer.logger.init_args.version with --ckpt_path {checkpoint_path(log_dir, LAST)}"
        )


def fit_checkpoint(ckpt: str | None, log_dir: str | None) -> str | None:
    """The checkpoint `fit` resumes from. Lightning's "last" is this run directory's last.ckpt,
    found here so that it gets the resume checks (where there is none Lightning would train from
    scratch, only warning). Without one, a run directory that already holds a run is refused,
    before Lightning writes anything there (its own refusal came after a new TensorBoard events
    file was added to the old run)."""
    run = Path(log_dir) if log_dir else None
    started = run is not None and (run / CONFIG).exists()
    never_saved = (
        f"{log_dir} holds a run that stopped before its first checkpoint (config.yaml, no checkpoint, no "
        f"metrics.json): delete that directory to start it again, or give another version"
    )
    if ckpt == "last":
        last = checkpoint_path(log_dir or ".", LAST)
        if not last.is_file():
            if started:
                raise ConfigError(f"ckpt_path: last: {never_saved}")
            raise ConfigError(
                f"ckpt_path: last: no {last} to resume (name the run with trainer.logger.init_args.version, "
                "or give the checkpoint's path)"
            )
        return str(last)
    if not ckpt and started:
        last = checkpoint_path(log_dir, LAST)
        if not last.is_file():
            raise ConfigError(f"trainer.logger.init_args.version: {never_saved}")
        if (run / METRICS).is_file():  # finished: not resumed in place (`not_a_finished_run`), so not advised
            raise ConfigError(
                f"trainer.logger.init_args.version: {log_dir} already holds a finished run (metrics.json): give "
                f"another version (or none: the next free one); to train it further, add --ckpt_path {last}"
            )
        raise ConfigError(
            f"trainer.logger.init_args.version: {log_dir} already holds a run (config.yaml): give another "
            f"version (or none: the next free one), or resume it with --ckpt_path {last}"
        )
    return ckpt
