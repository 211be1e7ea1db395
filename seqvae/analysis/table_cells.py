"""The cells and lines of `seqvae compare --baseline` that judge a difference (issue 35): a
difference whose paired values are all equal is "+32 on every seed (3/3)", not an interval;
IW-NLL and PPL of runs tested with different K or on other texts are not differenced unless
asked (`--allow-mixed-k`); a by-text interval is one checkpoint's and carries no * where seeds
exist; each by-seed cell gets the seeds it would need (`seeds_needed`), a planning estimate.
"""

from __future__ import annotations

import math
import statistics

from seqvae.analysis.differences import DIFF_KEYS, NOT_COMPARABLE, OTHER_TEXTS, differences, excludes_zero, t975
from seqvae.analysis.runs import MISSING
from seqvae.metric_spec import differenced, metric

UNIT = {"seed": "seed", "text": "text", "welch": "run"}
REFUSED = " — not differenced: "  # a refused cell's why: "<short> — not differenced: <reason>"
Z975 = statistics.NormalDist().inv_cdf(0.975)
BY_TEXT_NOTE = (
    "by text: an interval over one checkpoint's texts (the test-text and importance-sampling noise of those two "
    "checkpoints, not the training randomness seeds vary) says this checkpoint vs that one, not this method vs that one: "
    "two seeds' checkpoints can exclude 0 on opposite sides. Where a side has several seeds, its * is left off: "
    "a row's * is for its by-seed interval"
)
DEGENERATE_NOTE = (
    "on every seed (n/n): every paired difference was the same, so there is no spread to make an interval of; "
    "the difference held on each seed compared, which is not a known effect beyond those seeds "
    "(AU is a count: a shift of whole units on every seed is common when both sides sit at 0 or at the latent size)"
)
SEEDS_NOTE = (
    "seeds needed: the smallest number of seeds at which a 95% interval by seed would exclude 0, at the observed mean "
    "difference (or the one --resolve names) and paired s.d.; a planning estimate: it takes the observed s.d. as known, "
    "not a power calculation"
)
COMPACT_SEEDS = (
    "seeds needed for a 95% interval by seed of the {} difference to exclude 0, at the observed difference and "
    "paired s.d. (a planning estimate, not a power calculation; every metric's: --format json or --resolve X)"
)
SEEDS_METRIC = "iw_nll"  # the one whose seeds needed every table shows (all are in JSON, and per row with --resolve)


def seeds_needed(d: float, s: float) -> int | None:
    """The smallest n ≥ 2 with t(0.975, n−1)·s/√n < |d|: the seeds at which a mean paired difference
    of size d, with paired s.d. s, would have a 95% interval excluding 0. None for d = 0 or s = 0.
    A planning estimate: it takes s as known (it is itself estimated); it is not a power calculation."""
    if not (math.isfinite(d) and math.isfinite(s)) or d == 0 or s <= 0:
        return None
    d = abs(d)
    n = max(2, math.floor((Z975 * s / d) ** 2))  # t > z: no n at or below (z·s/d)² can do
    while t975(n - 1) * s / math.sqrt(n) >= d:
        n += 1
    return n


def paired_sd(d: dict) -> float | None:
    """The s.d. of a by-seed interval's paired differences, from its half-width t·s/√n."""
    if d.get("by") != "seed" or d.get("lo") is None:
        return None
    return (d["hi"] - d["lo"]) / 2 * math.sqrt(d["n"]) / t975(d["n"] - 1)


def degenerate(d: dict) -> bool:
    """An interval of width 0: every paired difference (or every run of both sides) equal."""
    return d.get("lo") is not None and d["hi"] - d["lo"] <= 1e-12 * max(1.0, abs(d["diff"]))


def k_of(run: dict) -> int | None:
    """The run's importance samples at test: metrics.json `iw_samples`, else config model.test_iw_samples."""
    k = run["metrics"].get("iw_samples", run["config"].get("model.test_iw_samples"))
    return k if isinstance(k, int) and not isinstance(k, bool) else None


def ks(runs: list[dict]) -> str:
    return "/".join(map(str, sorted({k for k in map(k_of, runs) if k is not None})))


def refuse(diff: dict, short: str, reason: str, flag: str = "k_biased") -> None:
    """Refuses the differences of the differenced metrics with `flag` set in metric_spec (default:
    those the number of importance samples K biases)."""
    for m in differenced():
        if getattr(m, flag):
            diff[m.id] = {"diff": None, "why": f"{short}{REFUSED}{reason}"}


def judge(g: dict, base: dict, diff: dict, line: str, allow_mixed_k: bool, resolve: float | None) -> tuple[str, str]:
    """Marks degenerate cells, refuses mixed K / other texts on IW-NLL and PPL, fills seeds needed;
    returns the row's pairing line (with what K says) and its seeds-needed line ("" for none)."""
    ka, kb = ks(g["runs"]), ks(base["runs"])
    other_texts = any(d.get("why") in (OTHER_TEXTS, NOT_COMPARABLE) for d in diff.values())
    if ka and kb and ka != kb:
        if allow_mixed_k:
            line += (
                f"; IW-NLL with different K ({ka} vs {kb} importance samples; --allow-mixed-k: the difference "
                "includes the two models' different finite-K bias)"
            )
        else:
            refuse(diff, f"K {ka} vs {kb}", "the finite-K bias of IW-NLL depends on the model")
            line += (
                f"; IW-NLL and PPL not differenced: K = {ka} vs {kb} importance samples, and the finite-K bias "
                "of IW-NLL (−ELBO − IW-NLL shrinks with K by a model-dependent amount) differs between the sides, "
                "so their difference is not the NLL difference (--allow-mixed-k to difference them)"
            )
    if other_texts and not allow_mixed_k:
        # means over test texts: a difference of them across different texts is a difference of corpora
        refuse(diff, "other texts", "tested on different texts", "text_mean")
        line += "; IW-NLL, −ELBO, KL, PPL (means over texts) not differenced on other texts (--allow-mixed-k to difference them)"
    needed, wanted = [], []
    for mid, d in diff.items():
        d["degenerate"] = True if degenerate(d) else None
        s = None if d["degenerate"] else paired_sd(d)
        if s is not None:
            d["seeds_needed"] = seeds_needed(d["diff"], s)
            d["seeds_needed_resolve"] = seeds_needed(resolve, s) if resolve is not None else None
            needed += [f"{metric(mid).header} {d['seeds_needed']}"] if d["seeds_needed"] else []
            wanted += [f"{metric(mid).header} {d['seeds_needed_resolve']}"] if d["seeds_needed_resolve"] else []
        diff[mid] = {**DIFF_KEYS, **d, "excludes_zero": None if d["degenerate"] else excludes_zero(d)}
    if resolve is None:  # the compact line of add_differences names this row's SEEDS_METRIC figure
        return line, ""
    if not (needed or wanted):
        return line, ""
    seeds = f"{g['label']}: seeds needed: {', '.join(needed) or 'none'}"
    if resolve is not None:
        seeds += f"; for a difference of {resolve:g}: {', '.join(wanted) or 'none'}"
    return line, seeds


def add_differences(groups: list[dict], allow_mixed_k: bool = False, resolve: float | None = None) -> list[str]:
    """Fills g["difference"], g["paired_by"] and g["pairing"] for every non-baseline group; returns the lines."""
    base = next((g for g in groups if g["baseline"]), None)
    if base is None:
        return []
    lines: dict[str, list[str]] = {}  # rows paired the same way share one line
    seeds_lines, by_text, flat = [], False, False
    for g in groups:
        if g is base:
            continue
        diff, short, line = differences(g, base)
        line, seeds = judge(g, base, diff, line, allow_mixed_k, resolve)
        g["difference"], g["paired_by"], g["pairing"] = diff, short, line
        lines.setdefault(line, []).append(g["label"])
        seeds_lines += [seeds] if seeds else []
        by_text |= any(d["by"] == "text" for d in diff.values())
        flat |= any(d.get("degenerate") for d in diff.values())
    compact = [
        f"{g['label']} {g['difference'][SEEDS_METRIC]['seeds_needed']}"
        for g in groups
        if g is not base and g["difference"][SEEDS_METRIC].get("seeds_needed")
    ]
    if resolve is None and compact:
        seeds_lines = [f"{COMPACT_SEEDS.format(metric(SEEDS_METRIC).header)}: {', '.join(compact)}"]
    notes = [BY_TEXT_NOTE] * by_text + [DEGENERATE_NOTE] * flat + [SEEDS_NOTE] * (bool(seeds_lines) and resolve is not None)
    return [f"{', '.join(labels)}: {line}" for line, labels in lines.items()] + seeds_lines + notes


def fixed(x: float, digits: int, sign: str = "") -> str:
    """x with `digits` decimals; from 1e7 on in scientific notation (a collapsed run's perplexity, 1.1e+28,
    was 29 digits wide in the table)."""
    return f"{x:{sign}.3e}" if math.isfinite(x) and abs(x) >= 1e7 else f"{x:{sign}.{digits}f}"


def number(x: float, digits: int, mid: str) -> str:
    counts = mid and metric(mid).count  # differences of a count (active units) are counts of units
    return f"{x:+.0f}" if counts and float(x).is_integer() else fixed(x, digits, "+")


def diff_cell(d: dict | None, digits: int, mid: str = "", row_n: int | None = None, star: bool = True) -> str:
    """A difference as the table shows it; `row_n`: the row's seeds (a by-seed cell on fewer says its n);
    `star`: whether an interval that excludes 0 is marked (not by text where a side has several seeds)."""
    if not d or d.get("diff") is None:
        why = (d or {}).get("why") or ""
        return f"{MISSING} ({why.split(REFUSED)[0]})" if REFUSED in why else MISSING
    text = number(d["diff"], digits, mid)
    if d.get("degenerate"):
        count = f"{d['n']}/{d['n']}" if d.get("by") != "welch" else f"{d['n']} runs"
        return f"{text} on every {UNIT.get(d.get('by'), 'pair')} ({count})"
    if d.get("lo") is not None:
        interval = f"[{fixed(d['lo'], digits, '+')}, {fixed(d['hi'], digits, '+')}]"
        cell = f"{text} {interval}" + ("*" if star and excludes_zero(d) else "")
        return cell + (f" (n={d['n']})" if d.get("by") == "seed" and row_n and d["n"] != row_n else "")
    if d.get("why") == NOT_COMPARABLE:
        return f"{text} ({NOT_COMPARABLE})"
    return f"{text} (n/a; MC se {d['mc_se']:.{digits}f})" if d.get("mc_se") is not None else f"{text} (n/a)"


def cell_of(g: dict, base: dict, mid: str, digits: int) -> str:
    """Row g's difference cell of `mid`: its n where fewer seeds have it; no * by text where seeds exist."""
    d = g["difference"].get(mid)
    row_n = int(g["paired_by"].rsplit("=", 1)[1]) if g["paired_by"].startswith("seed, n=") else None
    several = len(g["runs"]) > 1 or len(base["runs"]) > 1
    return diff_cell(d, digits, mid, row_n, star=not (several and d and d.get("by") == "text"))


def stat_cell(stat: dict, digits: int, mark: str = "") -> str:
    """mean ± s.d. (of the finite values), with its n where fewer runs have one and the non-finite count."""
    notes = [f"n={stat['n']}"] if "n" in stat else []
    notes += [f"{stat['nonfinite']} non-finite"] if stat.get("nonfinite") else []
    if stat["mean"] is None:
        return MISSING + (f" ({'; '.join(notes)})" if notes else "")
    text = fixed(stat["mean"], digits)
    text = (text if stat["std"] is None else f"{text} ± {fixed(stat['std'], digits)}") + mark
    return text + (f" ({'; '.join(notes)})" if notes else "")
