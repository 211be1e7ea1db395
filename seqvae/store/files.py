"""The run directory's files, named in one place, and the one way they are written.

A run directory `<save_dir>/<name>/<version>/` holds CONFIG, HPARAMS, VOCAB, TensorBoard event
files, CHECKPOINTS/{BEST_CKPT,LAST_CKPT}, METRICS with PER_TEXT (the test of the best checkpoint;
`metrics-2.json` + `per_text-2.csv` for a re-test), PREDICTIONS (predict) and, once exported,
CURVES. Every file seqvae writes there goes through `atomic_open` (or its two shorthands): a
temporary file in the target's directory, fsynced, renamed over the target with `os.replace`,
so a kill leaves either the previous file (or none) or the whole new one.

Torch-free: the analysis tools and `seqvae export` import it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

CONFIG = "config.yaml"
HPARAMS = "hparams.yaml"
VOCAB = "vocab.json"
METRICS = "metrics.json"
PER_TEXT = "per_text.csv"
CURVES = "curves.csv"
PREDICTIONS = "predictions.txt"
CHECKPOINTS = "checkpoints"  # a directory
BEST = "best"  # checkpoint names (ModelCheckpoint's filename; `--ckpt_path best|last`)
LAST = "last"
BEST_CKPT = f"{BEST}.ckpt"
LAST_CKPT = f"{LAST}.ckpt"
EVENTS_GLOB = "events.out.tfevents.*"


def checkpoint_path(run_dir: Path | str, name: str = LAST) -> Path:
    """`<run_dir>/checkpoints/<name>.ckpt`."""
    return Path(run_dir) / CHECKPOINTS / f"{name}.ckpt"


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "wb"):
    """Opens a temporary file beside `path` for writing (`mode` "wb", or "w": text, UTF-8, no
    newline translation); when the block ends without an exception, fsyncs it, gives it the
    permissions of an ordinary new file (0666 less the umask; mkstemp's 0600 would hide results
    from a cluster's other users) and renames it over `path`, then fsyncs the directory. On an
    exception (a kill included) the temporary file is removed and `path` is left as it was."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open: mode {mode!r}: 'wb' or 'w'")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8", "newline": ""} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Writes `data` at `path` atomically (`atomic_open`)."""
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: Path | str, text: str) -> None:
    """Writes `text` (UTF-8, line endings as given) at `path` atomically (`atomic_open`)."""
    atomic_write_bytes(path, text.encode("utf-8"))
