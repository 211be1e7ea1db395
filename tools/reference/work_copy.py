"""A reference implementation's work copy, outside the repository: a clean clone copied and
patched with the few documented text substitutions that current torch / numpy need (`HE_PATCHES`
for He et al.'s code; `pin.LI_PATCHES` for Li et al.'s), and the clone's commit. Shared by
`check` (yahoo10k runs), `pin` (the step-for-step pins) and `speed`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# (file, before, after, expected number of matches, why).  Only what current torch / numpy need; nothing that changes
# what the reference computes.
HE_PATCHES = [
    (
        "modules/decoders/dec_lstm.py",
        "self.loss = nn.CrossEntropyLoss(weight=vocab_mask, reduce=False)",
        "self.loss = nn.CrossEntropyLoss(weight=vocab_mask, reduction='none')",
        2,
        "`reduce=` is deprecated since torch 1.0 (warns, slated for removal); "
        "reduce=False is exactly reduction='none'",
    ),
    (
        "text.py",
        "id_ = np.random.random_integers(0, len(train_data_batch) - 1)",
        "id_ = np.random.randint(0, len(train_data_batch))",
        1,
        "np.random.random_integers is deprecated; it is randint(low, high + 1), same draws "
        "(only reached with --aggressive 1, not used here)",
    ),
]


def prepare_work(clone: Path, work: Path, patches: list[tuple]) -> list[dict]:
    """Copies a clean clone to `work` (its history, saved models, logs and samples left out) and
    applies `patches` (file, before, after, expected number of matches, why): each must match its
    stated number of times, or it stops. Returns what was applied, with the line numbers."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(clone, work, ignore=shutil.ignore_patterns(".git", "models", "logs", "samples"))
    applied = []
    for rel, before, after, count, why in patches:
        p = work / rel
        text = p.read_text()
        n = text.count(before)
        if n != count:
            raise SystemExit(f"patch {rel}: expected {count} match(es) of {before!r}, found {n}")
        lines = [m.start() for m in re.finditer(re.escape(before), text)]
        lines = [text[:i].count("\n") + 1 for i in lines]
        p.write_text(text.replace(before, after))
        applied.append({"file": rel, "lines": lines, "before": before, "after": after, "why": why})
    return applied


def clone_commit(clone: Path) -> str | None:
    """The clone's commit: git's, else its REFERENCE_COMMIT file."""
    for cmd in (["git", "-C", str(clone), "rev-parse", "HEAD"],):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        except Exception:
            pass
    f = clone / "REFERENCE_COMMIT"
    return f.read_text().strip() if f.exists() else None
