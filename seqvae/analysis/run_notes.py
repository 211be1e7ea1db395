"""The footnotes of `seqvae compare` about what made its runs: torch thread counts (results depend
on them: a row or a difference that mixes them is marked ‡), runs that record no provenance (no git
commit, no seeds in metrics.json) and re-tests, labelled by their checkpoint's training run.
"""

from __future__ import annotations

THREADS_MARK = "‡"


def threads(run: dict) -> int | None:
    """torch's thread count the run recorded (metrics.json provenance.torch_threads); None if it did not."""
    p = run["metrics"].get("provenance")
    n = p.get("torch_threads") if isinstance(p, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def thread_counts(runs: list[dict]) -> list[int]:
    return sorted({n for n in map(threads, runs) if n is not None})


def mixed_threads(*groups: dict) -> bool:
    """Whether these groups' runs recorded more than one torch thread count."""
    return len(thread_counts([r for g in groups for r in g["runs"]])) > 1


def counts(runs: list[dict]) -> str:
    each = [threads(r) for r in runs]
    return ", ".join(f"{n} ×{each.count(n)}" for n in thread_counts(runs))


def thread_notes(groups: list[dict]) -> list[str]:
    """One line per row whose runs used different torch thread counts, and one per difference that mixes them."""
    base = next((g for g in groups if g["baseline"]), None)
    lines = [
        f"{THREADS_MARK} {g['label']}: its runs used different torch thread counts ({counts(g['runs'])} runs); "
        "results depend on the thread count (docs/usage.md#determinism), so its s.d. includes that"
        for g in groups
        if mixed_threads(g)
    ]
    if base is not None:
        mixing = [g for g in groups if g is not base and not mixed_threads(g) and mixed_threads(g, base)]
        if mixing:
            rows = "; ".join(f"{g['label']} {counts(g['runs'])}" for g in mixing)
            lines.append(
                f"{THREADS_MARK} {', '.join(g['label'] for g in mixing)}: the difference to {base['label']} mixes "
                f"torch thread counts (rows {rows}; baseline {counts(base['runs'])}): part of it may be the "
                "thread count's"
            )
    return lines


def no_provenance(run: dict) -> bool:
    """A run whose metrics.json records neither its git commit nor its seeds (made before either was recorded)."""
    p = run["metrics"].get("provenance")
    return not (isinstance(p, dict) and p.get("git_commit")) and not isinstance(run["metrics"].get("seeds"), dict)


def provenance_note(groups: list[dict]) -> list[str]:
    """The rows (and runs) that record no provenance: what made them cannot be checked from their files."""
    which = []
    for g in groups:
        bare = [r for r in g["runs"] if no_provenance(r)]
        if bare:
            some = f" ({', '.join(r['path'].name for r in bare)})" if len(bare) < len(g["runs"]) else ""
            which.append(g["label"] + some)
    if not which:
        return []
    every = len(which) == len(groups) and all(no_provenance(r) for g in groups for r in g["runs"])
    return [
        f"No provenance (metrics.json records no git commit and no seeds: the code and seeds that made them are "
        f"not in their files): {'every run' if every else '; '.join(which)}"
    ]


def retest_note(groups: list[dict]) -> list[str]:
    """The re-tests (`seqvae test --ckpt_path`) and where their labels' training settings come from."""
    found, lost = [], []
    for g in groups:
        for r in g["runs"]:
            if r.get("retest"):
                (found if r["retest"]["training_run"] else lost).append(
                    f"{g['label']} ({r['path'].name}: {r['retest']['training_run'] or r['retest']['checkpoint']})"
                )
    lines = []
    if found:
        lines.append(
            "Re-tests (seqvae test --ckpt_path), grouped and labelled by their checkpoint's training run's "
            f"settings, with their own test split and evaluation settings: {'; '.join(found)}"
        )
    if lost:
        lines.append(
            "Re-tests whose checkpoint's training run is not here, labelled by the model settings the checkpoint "
            f"saved and their own test settings only: {'; '.join(lost)}"
        )
    return lines
