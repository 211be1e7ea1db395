"""seqvae.provenance: the code and machine facts a run records, in temporary git repositories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from seqvae.rundir import provenance as prov

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A checkout with a tracked package directory pkg/ and one commit."""
    root = tmp_path / "checkout"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "README").write_text("r\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "one")
    return root


@needs_git
def test_clean_then_dirty_checkout(repo):
    head = git(repo, "rev-parse", "HEAD")
    p = prov.provenance(["seqvae", "fit"], package_dir=repo / "pkg")
    assert p["git_commit"] == head and len(head) == 40
    assert p["git_dirty"] is False
    (repo / "untracked.txt").write_text("new\n")  # untracked files do not make the tree dirty
    assert prov.provenance(package_dir=repo / "pkg")["git_dirty"] is False
    (repo / "README").write_text("changed\n")  # a tracked file outside the package does
    p = prov.provenance(package_dir=repo / "pkg")
    assert p["git_dirty"] is True and p["git_commit"] == head
    git(repo, "commit", "-q", "-am", "two")
    p = prov.provenance(package_dir=repo / "pkg")
    assert p["git_dirty"] is False and p["git_commit"] == git(repo, "rev-parse", "HEAD") != head


@needs_git
def test_outside_a_checkout_and_in_an_ignored_copy(repo, tmp_path):
    outside = tmp_path / "site-packages" / "pkg"
    outside.mkdir(parents=True)
    p = prov.provenance(package_dir=outside)
    assert (p["git_commit"], p["git_dirty"]) == (None, None)
    # An installed copy under the checkout's ignored .venv is not the checkout's code.
    (repo / ".gitignore").write_text(".venv/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore")
    venv_pkg = repo / ".venv" / "lib" / "pkg"
    venv_pkg.mkdir(parents=True)
    (venv_pkg / "__init__.py").write_text("x = 1\n")
    assert prov.git_state(venv_pkg) == (None, None)
    assert prov.git_state(tmp_path / "does-not-exist") == (None, None)


@needs_git
def test_repository_without_commits(tmp_path):
    root = tmp_path / "fresh"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("")
    git(root, "init", "-q")
    git(root, "add", ".")
    assert prov.git_state(root / "pkg") == (None, True)  # staged, no HEAD yet


def test_git_missing_or_hanging_gives_none(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert prov.git_state(repo / "pkg") == (None, None)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "git").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    (fake / "git").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    monkeypatch.setattr(prov, "GIT_TIMEOUT_S", 0.5)
    start = datetime.now()
    p = prov.provenance(package_dir=repo / "pkg")
    assert (p["git_commit"], p["git_dirty"]) == (None, None)
    assert (datetime.now() - start).total_seconds() < 10


def test_facts_are_json_and_describe_this_process():
    import numpy
    import pytorch_lightning
    import torch

    p = prov.provenance(["seqvae", "fit", "--config", "a b.yaml", "--model.note", "it's"])
    assert json.loads(json.dumps(p)) == p
    assert p["command"] == "seqvae fit --config 'a b.yaml' --model.note 'it'\"'\"'s'"
    assert p["torch"] == torch.__version__ and p["pytorch_lightning"] == pytorch_lightning.__version__
    assert p["numpy"] == numpy.__version__ and p["python"] == ".".join(map(str, sys.version_info[:3]))
    assert p["cuda"] == torch.version.cuda and p["torch_threads"] == torch.get_num_threads()
    assert p["seqvae_version"] and p["tokenizers"] and p["torchmetrics"] and p["hostname"]
    assert isinstance(p["device"], str) and p["device"]
    if not torch.cuda.is_available():
        assert p["device"] == prov.cpu_name()
    stamp = datetime.fromisoformat(p["time"])
    assert stamp.tzinfo is not None and abs((datetime.now(timezone.utc) - stamp).total_seconds()) < 60
    assert {"git_commit", "git_dirty"} <= set(p)


def test_default_command_is_sys_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/x/bin/seqvae", "test", "--ckpt_path", "runs/a b/best.ckpt"])
    assert prov.provenance()["command"] == "/x/bin/seqvae test --ckpt_path 'runs/a b/best.ckpt'"


def test_version_from_pyproject_when_not_installed(tmp_path, monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pyproject.toml").write_text('[build-system]\nrequires = []\n\n[project]\nname = "seqvae"\nversion = "9.8.7"\n')
    assert prov.seqvae_version(tmp_path / "pkg") == "9.8.7"
    assert prov.seqvae_version(tmp_path / "elsewhere" / "pkg") is None
