"""The one checkpoint loader: `torch.load(weights_only=True)`, which allows, besides tensors and
plain values, the strategy classes declared in `store.strategies` (the strategy objects of the
hyper-parameters), under their module paths now and under the flat paths that checkpoints written
before the subpackages pickled them with (`seqvae.schedules.LinearKLWarmup`). Everything that
reads a checkpoint comes here, Lightning's restore included (`LoaderIO`); a command's
`--ckpt_path` is read once (`share`).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickletools
import zipfile
from pathlib import Path

import torch
from lightning_fabric.plugins import TorchCheckpointIO

from seqvae.errors import CorpusError


def seqvae_modules_named_in(path: str | Path) -> set[str]:
    """The seqvae modules whose classes the checkpoint at `path` pickled (its GLOBAL opcodes),
    read without unpickling; empty for a file torch.save did not write (torch.load then names
    what is wrong with it)."""
    if not isinstance(path, (str, Path)):
        return set()  # a file object: read once, by torch.load
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
        modules, strings = set(), []
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name == "GLOBAL":
                modules.add(arg.split(" ")[0])
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                modules.add(strings[-2])
            if isinstance(arg, str):
                strings.append(arg)
    except Exception:  # noqa: BLE001  (any unreadable file: torch.load's own error is the one reported)
        return set()
    return {m for m in modules if m.startswith("seqvae.") and "__main__" not in m}


def declare_classes_of(path: str | Path) -> None:
    """Imports the seqvae modules a checkpoint names, so that their strategy classes declare
    themselves (and are allowed) before it is read, whichever modules the caller has imported
    (a caller that imported only this loader included). Only seqvae's own modules are imported,
    and a class is allowed only if its module declares it."""
    for module in sorted(seqvae_modules_named_in(path)):
        with contextlib.suppress(ImportError):  # not a module (a nested class), or gone: torch.load refuses it
            importlib.import_module(module)


# The checkpoint file a command reads once (`share`): its resolved path -> (file identity, contents), or None before the read.
_SHARED: dict[Path, tuple[tuple, dict] | None] = {}


def share(path: str | Path | None) -> None:
    """From now on (until `unshare`) every load of this checkpoint file, while it is unchanged,
    gets the one read of it: the CLI's checks of `--ckpt_path`, the data module's vocabulary, the
    recorded settings, and Lightning's restore (`LoaderIO`), which takes it (the process does
    not keep it once Lightning is done with it). None: nothing is shared."""
    _SHARED.clear()
    if path is not None:
        _SHARED[Path(path).resolve()] = None


def unshare() -> None:
    _SHARED.clear()


def _identity(path: Path) -> tuple | None:
    try:
        s = os.stat(path)
    except OSError:
        return None
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns)


def load_checkpoint(path: str | Path, option: str, map_location="cpu", take: bool = False, **kwargs) -> dict:
    """torch.load with weights_only=True: a checkpoint is data, and one that carries anything
    but tensors, plain values and seqvae's registered classes is refused, in one line naming
    the option, instead of running the code it pickled. The shared file (`share`) is read once,
    onto the CPU and not memory-mapped (its contents outlive the call); `take`: the last reader."""
    key = Path(path).resolve() if _SHARED and map_location == "cpu" else None
    if key not in _SHARED:
        return _load(path, option, map_location, **kwargs)
    identity, kept = _identity(key), _SHARED[key]
    if kept is None or kept[0] != identity or identity is None:
        kept = _SHARED[key] = (identity, _load(path, option, "cpu"))
    if take:
        del _SHARED[key]
    return kept[1]


class LoaderIO(TorchCheckpointIO):
    """Lightning's checkpoint reads (the restore of `--ckpt_path`, fit's test of best.ckpt) through
    `load_checkpoint`: weights only, one line for a bad file, the shared read taken. Writes are Lightning's."""

    def load_checkpoint(self, path, map_location=None, weights_only=None) -> dict:
        return load_checkpoint(path, "ckpt_path", take=True)


def _load(path: str | Path, option: str, map_location, **kwargs) -> dict:
    import pickle

    declare_classes_of(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True, **kwargs)
    except FileNotFoundError:
        raise CorpusError(f"{option}: no such checkpoint file {path}") from None
    except IsADirectoryError:
        raise CorpusError(f"{option}: {path} is a directory, not a checkpoint file") from None
    except pickle.UnpicklingError as err:
        if not zipfile.is_zipfile(path):  # not torch.save's zip at all (a text file, random bytes): unreadable, not unsafe
            raise CorpusError(_unreadable(path, option)) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CorpusError(
            f"{option}: {path}: refused to load (it carries objects other than weights and seqvae's settings; "
            f"only load checkpoints you trust with torch.load(weights_only=False) yourself): {first}"
        ) from None
    except Exception:  # noqa: BLE001 - arbitrary bytes make torch.load raise anything (KeyError for a text file)
        # torch's own text names its zip reader's internals (`PytorchStreamReader failed reading
        # zip archive: failed finding central directory`, or `KeyError: 101` for a file of text),
        # not what is wrong with the file.
        raise CorpusError(_unreadable(path, option)) from None


def _unreadable(path: str | Path, option: str) -> str:
    size = Path(path).stat().st_size
    return (
        f"{option}: {path}: not a readable checkpoint ({size} bytes: truncated, or not a file written by torch.save / seqvae fit)"
    )


def require_run_checkpoint(checkpoint, path: str | Path, option: str):
    """`checkpoint` (a torch.load result) if it is what `seqvae fit` writes, Lightning's dict with the
    model's `state_dict`; else one line naming the option. A file torch.save wrote with something
    else (a bare state dict, a tensor, a dict of one's own) gave a KeyError or AttributeError
    traceback, after `test` had made its run directory."""
    if isinstance(checkpoint, dict) and isinstance(checkpoint.get("state_dict"), dict):
        return checkpoint
    what = (
        f"a dict with keys {', '.join(map(repr, list(checkpoint)[:4]))}"
        if isinstance(checkpoint, dict)
        else f"a {type(checkpoint).__name__}"
    )
    raise CorpusError(
        f"{option}: {path}: a torch.save file, but not a checkpoint of `seqvae fit` (it holds {what}; a checkpoint is "
        "Lightning's dict with the model's 'state_dict', as RUN/checkpoints/best.ckpt)"
    )
