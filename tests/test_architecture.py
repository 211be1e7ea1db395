"""The house rules (docs/architecture.md), kept by tests: no module over 400 lines, SeqVAE
within 300 and SeqVAECLI within 120, no import circle (module-level or inside functions), the
layer table, the tools torch-free, the old flat module paths the same module objects as the
moved ones, and checkpoints that pickled their classes under the old paths still loading with
weights_only=True."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import seqvae

PACKAGE = Path(seqvae.__file__).resolve().parent
MAX_LINES, MAX_MODEL_LINES, MAX_CLI_LINES = 400, 300, 120


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The seqvae modules `name` imports anywhere in its file (module level or in a function)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            candidates = [base, *(f"{base}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        for c in candidates:
            c = seqvae.OLD_PATHS.get(c, c)
            if c in known and c != name and c != "seqvae":
                found.add(c)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_module_over_400_lines_and_seqvae_within_300():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}
    tree = ast.parse((PACKAGE / "core" / "model.py").read_text())
    (model,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SeqVAE"]
    assert model.end_lineno - model.lineno + 1 <= MAX_MODEL_LINES


def test_the_cli_class_parses_and_wires_within_120_lines():
    """SeqVAECLI calls the guards, data lines and result writers where they live (issue 47)."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    (cli,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SeqVAECLI"]
    assert cli.end_lineno - cli.lineno + 1 <= MAX_CLI_LINES


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d) :] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_cycle_finder_finds_a_constructed_circle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle():
    assert cycle(graph()) is None


# Which sub-system may import which (docs/architecture.md, "Layers"). The top (cli, commands,
# diagnostics, the package itself) may import anything.
ALLOWED = {
    "errors": set(),
    "clock": set(),
    "text": {"errors", "options", "checkpoints"},
    "options": {"errors"},
    "config_sources": {"errors", "text"},
    "training": {"errors", "clock", "text", "options", "rundir", "analysis", "checkpoints"},
    "core": {"errors", "options", "text", "training", "checkpoints"},
    # The one checkpoint loader knows the classes a checkpoint may carry (core's strategies) and
    # the vocabulary (text); text (data.vocab) and core (a pretrained encoder) read through it.
    "checkpoints": {"errors", "text", "core"},
    "rundir": {"errors", "analysis"},
    "analysis": {"errors", "text", "rundir"},
    "analysis.probe": {"errors", "text", "rundir", "analysis", "checkpoints", "core"},  # a tool: loads a model to encode with
    "experiments": {"errors", "clock", "analysis", "rundir", "cli"},
}


def layer(module: str) -> str:
    if module == "seqvae.rundir.checkpoints":
        return "checkpoints"
    if module == "seqvae.analysis.probe":
        return "analysis.probe"
    return module.split(".")[1] if module.count(".") else module


def test_layers_import_only_what_the_table_allows():
    wrong = []
    for module, deps in graph().items():
        own = layer(module)
        for dep in deps:
            if own in ALLOWED and layer(dep) != own and layer(dep) not in ALLOWED[own]:
                wrong.append(f"{module} -> {dep}")
    assert wrong == []


TOOLS = ("seqvae.commands", "seqvae.analysis.compare", "seqvae.experiments.sweep", "seqvae.experiments.executors",
         "seqvae.experiments.grid", "seqvae.rundir.export", "seqvae.text.download", "seqvae.text.splits",
         "seqvae.config_sources")  # fmt: skip


def test_the_tools_and_help_start_without_torch():
    code = (
        "import sys\n"
        f"for m in {TOOLS!r}: __import__(m)\n"
        "from seqvae.commands import main\n"
        "for argv in (['--help'], ['compare', '--help'], ['sweep', '--help'], ['export', '--help'], ['download', '--help']):\n"
        "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
        "heavy = [m for m in ('torch', 'pytorch_lightning', 'matplotlib', 'tokenizers') if m in sys.modules]\n"
        "sys.exit(f'loaded {heavy}' if heavy else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("old, new", sorted(seqvae.OLD_PATHS.items()))
def test_an_old_module_path_is_the_moved_module_itself(old, new):
    import importlib

    assert importlib.import_module(old) is importlib.import_module(new)


def test_a_checkpoint_pickled_under_the_old_paths_loads_with_weights_only(tmp_path):
    import torch

    from seqvae import LinearKLWarmup
    from seqvae.rundir.checkpoints import load_checkpoint

    path = tmp_path / "old.ckpt"
    LinearKLWarmup.__module__ = "seqvae.schedules"  # as checkpoints written before the subpackages name it
    try:
        torch.save({"hyper_parameters": {"kl_schedule": LinearKLWarmup(start=0.2, warmup_epochs=3)}}, path)
    finally:
        LinearKLWarmup.__module__ = "seqvae.core.schedules"
    import zipfile

    with zipfile.ZipFile(path) as z:
        pickled = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"seqvae.schedules" in pickled and b"seqvae.core.schedules" not in pickled  # the old name is what is read
    loaded = load_checkpoint(path, "ckpt_path")["hyper_parameters"]["kl_schedule"]
    assert isinstance(loaded, LinearKLWarmup) and (loaded.start, loaded.warmup_epochs) == (0.2, 3)


def test_an_old_module_path_runs_with_python_m():
    """`python -m seqvae.sweep` (scripts and users' habits) runs the moved module."""
    result = subprocess.run([sys.executable, "-m", "seqvae.sweep", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage: seqvae sweep"), result.stderr[-2000:]
