"""seqvae: LSTM sequence VAEs that do not collapse, with the metrics that tell.

The package is split by sub-system (docs/architecture.md): `core/` (the model and its maths),
`store/` (run files, the checkpoint loader, the strategy registry), `text/` (corpora, splits,
vocabulary, batching), `training/` (callbacks, log lines), `rundir/`
(the run directory's files), `analysis/` (reading and comparing runs; torch-free),
`experiments/` (grids and sweeps; torch-free), and the CLI at the top.

The names below load on first use (PEP 562), so that `seqvae --help`, `seqvae compare` and the
other tools start without importing torch and Lightning; `from seqvae import SeqVAE` and the
configs' `class_path: seqvae.LinearKLWarmup` work as before. The flat module paths of earlier
releases (`seqvae.model`, `seqvae.data`, …) import as the moved modules themselves (`OLD_PATHS`):
`seqvae.model is seqvae.core.model`, so monkeypatching either reaches the real code.
"""

import importlib
import importlib.abc
import importlib.util
import sys

_WHERE = {
    "AggressiveTraining": "core.aggressive",
    "AtomicCheckpointIO": "training.callbacks",
    "PeriodicCheckpoint": "training.callbacks",
    "PlateauRule": "training.callbacks",
    "reuse_freed_memory": "training.allocator",
    "TextDataModule": "text.datamodule",
    "Vocabulary": "text.corpus",
    "read_corpus": "text.corpus",
    "BatchFreeBits": "core.losses",
    "CosineDispersion": "core.losses",
    "FreeBits": "core.losses",
    "KLPenalty": "core.losses",
    "Regularizer": "core.losses",
    "StandardKL": "core.losses",
    "SeqVAE": "core.model",
    "ConstantKL": "core.schedules",
    "CyclicalKL": "core.schedules",
    "KLSchedule": "core.schedules",
    "LinearKLWarmup": "core.schedules",
    "IsoBN": "core.isobn",
    "TransformerEncoder": "core.transformer",
}
__all__ = sorted(_WHERE)

# Module paths before the subpackages (checkpoints pickle their strategy classes under these
# names; users' scripts import them): old name -> the module it now is.
OLD_PATHS = {
    "seqvae.aggressive": "seqvae.core.aggressive",
    "seqvae.allocator": "seqvae.training.allocator",
    "seqvae.bn_bound": "seqvae.core.bn_bound",
    "seqvae.callbacks": "seqvae.training.callbacks",
    "seqvae.compare": "seqvae.analysis.compare",
    "seqvae.corpus": "seqvae.text.corpus",
    "seqvae.data": "seqvae.text.datamodule",
    "seqvae.differences": "seqvae.analysis.differences",
    "seqvae.download": "seqvae.text.download",
    "seqvae.evaluation": "seqvae.core.evaluation",
    "seqvae.executors": "seqvae.experiments.executors",
    "seqvae.export": "seqvae.rundir.export",
    "seqvae.fused_ce": "seqvae.core.fused_ce",
    "seqvae.generation": "seqvae.core.generation",
    "seqvae.grid": "seqvae.experiments.grid",
    "seqvae.hints": "seqvae.text.hints",
    "seqvae.log_lines": "seqvae.training.log_lines",
    "seqvae.losses": "seqvae.core.losses",
    "seqvae.metrics": "seqvae.core.metrics",
    "seqvae.model": "seqvae.core.model",
    "seqvae.networks": "seqvae.core.networks",
    "seqvae.plots": "seqvae.analysis.plots",
    "seqvae.provenance": "seqvae.rundir.provenance",
    "seqvae.run_files": "seqvae.rundir.run_files",
    "seqvae.runs": "seqvae.analysis.runs",
    "seqvae.schedules": "seqvae.core.schedules",
    "seqvae.scoring": "seqvae.core.scoring",
    "seqvae.splits": "seqvae.text.splits",
    "seqvae.sweep": "seqvae.experiments.sweep",
    # moved since: to the ground floor (the loader, the file names, the strategy registry), or
    # renamed so that no two rooms hold a module of the same name
    "seqvae.analysis.cells": "seqvae.analysis.table_cells",
    "seqvae.core.strategies": "seqvae.store.strategies",
    "seqvae.rundir.callbacks": "seqvae.rundir.run_dir_callbacks",
    "seqvae.rundir.checkpoints": "seqvae.store.checkpoints",
    "seqvae.rundir.files": "seqvae.store.files",
}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `seqvae.model` as the module object `seqvae.core.model` (one module under two
    names, not a copy)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in OLD_PATHS else None

    def create_module(self, spec):
        return importlib.import_module(OLD_PATHS[spec.name])

    def exec_module(self, module):
        pass  # already executed under its own name

    def get_code(self, name):  # `python -m seqvae.sweep` (runpy) runs the moved module's code
        new = OLD_PATHS[name]
        return importlib.util.find_spec(new).loader.get_code(new)

    def is_package(self, name):
        return False


if not any(isinstance(f, _OldPath) for f in sys.meta_path):
    sys.meta_path.append(_OldPath())


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    if name[:1].isupper():
        # A strategy class declared where it is defined (`store.strategies`): the model's module
        # imports every strategy module. (Only class names: `from seqvae import compare` must
        # not import torch before it finds the submodule.)
        importlib.import_module(".core.model", __name__)
        value = importlib.import_module(".store.strategies", __name__).STRATEGIES.get(name)
        if value is not None:
            globals()[name] = value
            return value
    raise AttributeError(f"module 'seqvae' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_WHERE])
