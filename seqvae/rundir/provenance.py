"""What made a run: the code (git commit, uncommitted changes, versions), the machine and the command.

    from seqvae.provenance import provenance
    metrics["provenance"] = provenance()

Every value is JSON-serialisable. Nothing here can fail a run: a missing `git`, a package that is
not in a git checkout (an installed wheel), a hung git or an unreadable /proc/cpuinfo each give
None for the facts they would have given.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

GIT_TIMEOUT_S = 5.0
# distribution name -> the key it is recorded under
PACKAGES = {
    "torch": "torch",
    "pytorch-lightning": "pytorch_lightning",
    "torchmetrics": "torchmetrics",
    "tokenizers": "tokenizers",
    "numpy": "numpy",
}


def _git(directory: Path, *args: str) -> str | None:
    """stdout of `git -C directory ARGS`, stripped; None when git is missing, fails or hangs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # no GIT_DIR from a calling hook
    try:
        done = subprocess.run(
            ["git", "-C", str(directory), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(package_dir: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout whose tracked files hold `package_dir`; (None, None) when
    it is in none (an installed copy, even one inside some other repository's ignored .venv)."""
    package_dir = Path(package_dir)
    if not package_dir.is_dir():
        return None, None
    top = _git(package_dir, "rev-parse", "--show-toplevel")
    if not top:
        return None, None
    # The package's own files must be tracked there: site-packages under an ignored .venv is not the code.
    tracked = _git(package_dir, "ls-files", "--", ".")
    if not tracked:
        return None, None
    commit = _git(package_dir, "rev-parse", "--verify", "HEAD")  # None in a repository without commits
    status = _git(Path(top), "status", "--porcelain", "--untracked-files=no")
    return commit or None, (None if status is None else bool(status))


def seqvae_version(package_dir: Path) -> str | None:
    try:
        return importlib.metadata.version("seqvae")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(package_dir).parent / "pyproject.toml"
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r'^\[project\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    return m.group(1) if m else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        module = sys.modules.get(PACKAGES.get(dist, dist))
        return getattr(module, "__version__", None)


def cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def device_facts() -> dict:
    """cuda / cudnn versions (None on CPU builds), the device's name, torch's thread count and TF32."""
    try:
        import torch
    except ImportError:
        return {"cuda": None, "cudnn": None, "device": cpu_name(), "torch_threads": None, "matmul_tf32": None, "cudnn_tf32": None}
    device = None
    try:
        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            device = torch.cuda.get_device_name(0) + (f" (×{n})" if n > 1 else "")
    except Exception:  # a broken driver must not fail the run  # noqa: BLE001
        device = None
    cudnn = None
    try:
        if torch.version.cuda is not None and torch.backends.cudnn.is_available():
            cudnn = torch.backends.cudnn.version()
    except Exception:  # noqa: BLE001
        cudnn = None
    # TF32 (seqvae/training/precision.py): None off CUDA, where neither setting applies.
    on_cuda = device is not None
    return {
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "device": device or cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "matmul_tf32": torch.get_float32_matmul_precision() != "highest" if on_cuda else None,
        "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32) if on_cuda else None,
    }


def provenance(argv: list[str] | None = None, package_dir: str | os.PathLike | None = None) -> dict:
    """Facts about the code and machine that made a run (JSON-serialisable).

    `argv`: the command (default sys.argv), recorded shell-quoted as one string. `package_dir`: the
    directory whose git checkout is recorded (default: the imported seqvae package's)."""
    if package_dir is None:
        package_dir = Path(__file__).resolve().parent
    package_dir = Path(package_dir)
    commit, dirty = git_state(package_dir)
    facts = {
        "git_commit": commit,
        "git_dirty": dirty,
        "seqvae_version": seqvae_version(package_dir),
        "python": platform.python_version(),
        **{key: _version(dist) for dist, key in PACKAGES.items()},
        **device_facts(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "command": shlex.join(str(a) for a in (sys.argv if argv is None else argv)),
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return facts
