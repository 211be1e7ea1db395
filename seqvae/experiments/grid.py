"""A sweep's grid file and its expansion into cells (`seqvae sweep GRID.yaml`; the file format
is described in `seqvae/experiments/sweep.py`, which runs the cells): validation of every key with
one-line errors naming the file and key, `${seed}`/`${variant}`/`${root}` interpolation, the
`--variants` / `--seeds` selection, and the cluster resources of each cell (`slurm:`, used by
`--executor slurm|submitit-local`, see `seqvae/experiments/executors.py`). What state a cell is in
is read from its run directory by `seqvae/experiments/cells.py`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from seqvae.config_sources import UniqueKeyLoader
from seqvae.experiments import cells as cell_state

GRID_KEYS = ("root", "configs", "overrides", "seeds", "variants", "export", "slurm")
VARIANT_KEYS = ("name", "configs", "overrides", "needs", "slurm")
# A cell's cluster resources (submitit's names): strings, integers (minimum), a positive number.
SLURM_KEYS = {
    "partition": str,
    "account": str,
    "qos": str,
    "constraint": str,
    "nodes": 1,
    "gpus_per_node": 0,
    "cpus_per_task": 1,
    "timeout_min": 1,
    "mem_gb": float,
}
RESERVED = ("seed_everything", "trainer.logger", "ckpt_path", "config")  # set by the sweep itself
VARIABLES = ("seed", "variant", "root")
INTERPOLATION = re.compile(r"\$\{([^}]*)\}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


class GridError(Exception):
    """A bad grid file; the message is one line naming the file and the key."""


@dataclass
class Cell:
    index: int  # 1-based position in the grid
    total: int
    variant: str
    seed: int
    run_dir: Path
    args: list[str]  # `seqvae fit` arguments, without --ckpt_path
    needs: list[Path] = field(default_factory=list)  # run directories that must have finished first
    export_dir: Path | None = None  # where its small result files are copied once it finished
    slurm: dict = field(default_factory=dict)  # cluster resources (SLURM_KEYS) of the grid and the variant
    where: dict = field(default_factory=dict)  # override key -> its grid file key (`overrides.K`, `variants[i].overrides.K`)

    @property
    def name(self) -> str:
        return f"{self.variant}/seed{self.seed}"

    @property
    def tag(self) -> str:
        return f"[{self.index}/{self.total}] {self.name}"

    @property
    def last_ckpt(self) -> Path:
        return cell_state.last_ckpt(self.run_dir)

    def state(self) -> str:
        """finished, interrupted, exported or new (`cells.state`)."""
        return cell_state.state(self.run_dir, self.export_dir)

    def recorded_args(self) -> list[str] | None:
        """The grid arguments this cell's run started with (sweep.run), None if not recorded."""
        return cell_state.recorded_args(self.run_dir)

    def fit_args(self) -> list[str]:
        return [*self.args, "--ckpt_path", str(self.last_ckpt)] if self.state() == "interrupted" else list(self.args)


# ------------------------------------------------------------------------------------- grid file
def cli_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def interpolate(value, variables: dict[str, str], where: str):
    if isinstance(value, str):

        def sub(m):
            if m.group(1) not in variables:
                known = ", ".join("${" + v + "}" for v in VARIABLES)
                raise GridError(f"{where}: unknown interpolation ${{{m.group(1)}}} (known: {known})")
            return variables[m.group(1)]

        return INTERPOLATION.sub(sub, value)
    if isinstance(value, list):
        return [interpolate(v, variables, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: interpolate(v, variables, f"{where}.{k}") for k, v in value.items()}
    return value


def _config_list(value, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise GridError(f"{where}: expected a list of config file paths")
    for i, p in enumerate(value):
        if not Path(p).is_file():
            raise GridError(f"{where}[{i}]: no such file {p}")
    return list(value)


def _overrides(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GridError(f"{where}: expected a mapping of dotted keys to values (model.pooling: max)")
    for key in value:
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_0-9][\w]*)*", key):
            raise GridError(f"{where}.{key}: not a dotted config key")
        if any(key == r or key.startswith(r + ".") for r in RESERVED):
            raise GridError(f"{where}.{key}: set by the sweep (seeds, root and the variant name); remove it")
    return dict(value)


def slurm_value(key: str, value, where: str):
    """One checked resource value; `value` may be a command-line string. Raises GridError naming `where`."""
    kind = SLURM_KEYS[key]
    if isinstance(value, str) and kind is not str:
        try:
            value = float(value) if kind is float else int(value)
        except ValueError:
            pass
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            raise GridError(f"{where}: expected a non-empty string, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise GridError(f"{where}: expected a positive number, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, int) or value < kind:
        raise GridError(f"{where}: expected an integer >= {kind}, got {value!r}")
    return value


def _slurm(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GridError(f"{where}: expected a mapping with keys {', '.join(SLURM_KEYS)}")
    for key in value:
        if key not in SLURM_KEYS:
            raise GridError(f"{where}.{key}: unknown key (expected {', '.join(SLURM_KEYS)})")
    return {key: slurm_value(key, v, f"{where}.{key}") for key, v in value.items()}


def load_grid(path: str | Path) -> list[Cell]:
    """Parses and checks a grid file; raises GridError with one line naming the file and the key."""
    path = Path(path)
    try:
        grid = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # a key given twice: refused
    except OSError as err:
        raise GridError(f"{path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        if mark is not None and problem:
            raise GridError(f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}") from None
        raise GridError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    return grid_cells(grid, str(path))


def grid_cells(grid, source: str) -> list[Cell]:
    """The cells of a parsed grid (a dict, as in a grid file); errors name `source` and the key."""
    try:
        return _cells(grid)
    except GridError as err:
        raise GridError(f"{source}: {err}") from None


def _cells(grid) -> list[Cell]:
    root, export, configs, common, resources, seeds = _top_level(grid)
    if not isinstance(grid["variants"], list):
        raise GridError("variants: expected a list of {name, configs, overrides, needs, slurm}")
    variants: list[dict] = []
    for i, v in enumerate(grid["variants"]):
        variants.append(_variant(v, f"variants[{i}]", [w["name"] for w in variants], configs, common, resources))
    return _expand(root, export, seeds, variants)


def _top_level(grid) -> tuple[str, str | None, list[str], dict, dict, list[int]]:
    """The grid's own keys, checked: (root, export, configs, overrides, slurm, seeds)."""
    if not isinstance(grid, dict):
        raise GridError(f"expected a mapping with keys {', '.join(GRID_KEYS)}")
    for key in grid:
        if key not in GRID_KEYS:
            raise GridError(f"{key}: unknown key (expected {', '.join(GRID_KEYS)})")
    for key in ("root", "configs", "seeds", "variants"):
        if key not in grid or grid[key] in (None, [], ""):
            raise GridError(f"{key}: missing")
    root = grid["root"]
    if not isinstance(root, str):
        raise GridError("root: expected a directory path")
    export = grid.get("export")
    if export is not None and not isinstance(export, str):
        raise GridError("export: expected a directory path")
    for key, path in (("root", root), ("export", export)):  # before: a traceback when the first cell (or export) began
        blocking = next((p for p in (Path(path), *Path(path).parents) if p.exists() and not p.is_dir()), None) if path else None
        if blocking is not None:
            raise GridError(f"{key}: {path}: {blocking} is a file, not a directory")
    configs = _config_list(grid["configs"], "configs")
    common = _overrides(grid.get("overrides"), "overrides")
    resources = _slurm(grid.get("slurm"), "slurm")
    seeds = grid["seeds"]
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise GridError("seeds: expected a list of integers")
    if any(not 0 <= s < 2**32 for s in seeds):  # Lightning's seed_everything range
        raise GridError(f"seeds: each must be in [0, 2**32 - 1], got {[s for s in seeds if not 0 <= s < 2**32]}")
    if len(set(seeds)) < len(seeds):
        raise GridError("seeds: repeated seed")
    return root, export, configs, common, resources, seeds


def _variant(v, where: str, earlier: list[str], configs: list[str], common: dict, resources: dict) -> dict:
    """One checked entry of `variants` (`earlier`: the names listed before it), merged with the
    grid's configs, overrides and slurm; "where" says which file key each override came from."""
    if not isinstance(v, dict):
        raise GridError(f"{where}: expected a mapping with keys {', '.join(VARIANT_KEYS)}")
    for key in v:
        if key not in VARIANT_KEYS:
            raise GridError(f"{where}.{key}: unknown key (expected {', '.join(VARIANT_KEYS)})")
    name = v.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GridError(f"{where}.name: missing or not a directory name (letters, digits, _ . + -)")
    if name in earlier:
        raise GridError(f"{where}.name: repeated variant {name}")
    needs = v.get("needs") or []
    if not isinstance(needs, list) or not all(isinstance(n, str) for n in needs):
        raise GridError(f"{where}.needs: expected a list of variant names")
    for n in needs:
        if n not in earlier:
            raise GridError(f"{where}.needs: {n} is not a variant listed before {name}")
    extra = _config_list(v.get("configs"), f"{where}.configs")
    overrides = {**common, **_overrides(v.get("overrides"), f"{where}.overrides")}
    where_of = {k: (f"{where}.overrides.{k}" if k in (v.get("overrides") or {}) else f"overrides.{k}") for k in overrides}
    slurm = {**resources, **_slurm(v.get("slurm"), f"{where}.slurm")}
    return {"name": name, "configs": configs + extra, "overrides": overrides, "where": where_of, "needs": needs, "slurm": slurm}


def _expand(root: str, export: str | None, seeds: list[int], variants: list[dict]) -> list[Cell]:
    """The cells, seed by seed in the order of `variants`, with their `seqvae fit` arguments."""
    total = len(seeds) * len(variants)
    cells = []
    for seed in seeds:
        for v in variants:
            variables = {"seed": str(seed), "variant": v["name"], "root": root}
            args = [word for c in v["configs"] for word in ("--config", c)]
            args += ["--seed_everything", str(seed)]
            for key, value in v["overrides"].items():
                args += [f"--{key}", cli_value(interpolate(value, variables, v["where"][key]))]
            args += [
                "--trainer.logger.init_args.save_dir",
                root,
                "--trainer.logger.init_args.name",
                v["name"],
                "--trainer.logger.init_args.version",
                f"seed{seed}",
            ]
            needs = [Path(root) / n / f"seed{seed}" for n in v["needs"]]
            run_dir = Path(root) / v["name"] / f"seed{seed}"
            export_dir = Path(export) / v["name"] / f"seed{seed}" if export else None
            cells.append(
                Cell(len(cells) + 1, total, v["name"], seed, run_dir, args, needs, export_dir, dict(v["slurm"]), v["where"])
            )
    return cells


def select(cells: list[Cell], variants: str | None, seeds: str | None) -> list[Cell]:
    """The cells of the listed variants and seeds (comma-separated; None: all), renumbered."""
    keep = list(cells)
    if variants is not None:
        names = [n for n in variants.split(",") if n]
        if not names:  # `--variants ''` selected no cell: "0 cells", exit 1, as if the grid had none
            raise GridError(f"--variants: expected comma-separated variant names, got {variants!r}")
        unknown = [n for n in names if n not in {c.variant for c in cells}]
        if unknown:
            raise GridError(f"--variants: {', '.join(unknown)} not in the grid")
        keep = [c for c in keep if c.variant in names]
    if seeds is not None:
        try:
            wanted = [int(x) for x in seeds.split(",")]
        except ValueError as err:  # '' and '1,,2' too
            raise GridError(f"--seeds: expected comma-separated integers, got {seeds!r}") from err
        unknown = [str(x) for x in wanted if x not in {c.seed for c in cells}]
        if unknown:
            raise GridError(f"--seeds: {', '.join(unknown)} not in the grid")
        keep = [c for c in keep if c.seed in wanted]
    return [replace(c, index=i + 1, total=len(keep)) for i, c in enumerate(keep)]
