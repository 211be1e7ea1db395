"""Differences to a baseline with 95% intervals (`seqvae compare --baseline`): paired by seed
(t-interval over the common seeds), unpaired (Welch), or — one run per side — paired by test text
from the runs' per-text files. See `seqvae/analysis/compare.py` for when each applies; `cells.py` renders them
and adds what depends on both sides (K, seeds needed).
"""

from __future__ import annotations

import csv
import math
import statistics

from seqvae.analysis.runs import MISSING, CompareError, texts_digests, value
from seqvae.metric_spec import SPEC, differenced, metric, per_text_columns

# A difference in JSON: diff (row − baseline), 95% bounds lo/hi, n pairs (texts, seeds) or runs, df of the
# t quantile, by ("text", "seed", "welch" or None), why there is no interval, MC se of a one-run difference;
# the seeds a by-seed interval used, whether every paired difference was equal (no spread: no interval to
# read), and the seeds at which the observed mean difference (and `--resolve X`) would exclude 0
# (`seqvae/analysis/table_cells.py`).
DIFF_KEYS = dict.fromkeys(
    (
        "diff",
        "lo",
        "hi",
        "n",
        "df",
        "by",
        "why",
        "mc_se",
        "excludes_zero",
        "seeds",
        "degenerate",
        "seeds_needed",
        "seeds_needed_resolve",
    )
)
# Why a difference has no interval when its two sides were not all tested on the same texts.
OTHER_TEXTS = "tested on different texts than the baseline"
# Two-sided 95% quantiles of Student's t, t(0.975, df), for df 1..30; beyond, the Cornish-Fisher
# expansion around the normal quantile (its P(T < t) is off by < 1e-8 from df 31 on; tests/test_compare.py).
T975 = tuple(
    float(t)
    for t in """
    12.706204736 4.302652730 3.182446305 2.776445105 2.570581836 2.446911851 2.364624252 2.306004135
    2.262157163 2.228138852 2.200985160 2.178812830 2.160368656 2.144786688 2.131449546 2.119905299
    2.109815578 2.100922040 2.093024054 2.085963447 2.079613845 2.073873068 2.068657610 2.063898562
    2.059538553 2.055529439 2.051830516 2.048407142 2.045229642 2.042272456
""".split()
)


def t975(df: float) -> float:
    """t(0.975, df); a fractional df (Welch) is rounded down, which widens the interval."""
    df = int(math.floor(df))
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = statistics.NormalDist().inv_cdf(0.975)
    g = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


def t_interval(d: list[float]) -> dict:
    """mean(d) ± t(0.975, n−1)·sd(d)/√n; no bounds for fewer than 2 values."""
    n = len(d)
    mean = statistics.fmean(d) if d else None
    if n < 2:
        return {"diff": mean, "lo": None, "hi": None, "n": n}
    half = t975(n - 1) * statistics.stdev(d) / math.sqrt(n)
    return {"diff": mean, "lo": mean - half, "hi": mean + half, "n": n, "df": n - 1}


def welch_interval(a: list[float], b: list[float]) -> dict:
    """mean(a) − mean(b) ± t(0.975, ν)·√(s_a²/n_a + s_b²/n_b), ν by Welch–Satterthwaite (rounded down)."""
    diff = statistics.fmean(a) - statistics.fmean(b)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return {"diff": diff, "lo": diff, "hi": diff, "n": len(a) + len(b), "df": len(a) + len(b) - 2}
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = t975(df) * math.sqrt(va + vb)
    return {"diff": diff, "lo": diff - half, "hi": diff + half, "n": len(a) + len(b), "df": math.floor(df)}


def diff_ids() -> list[str]:
    """The metrics that get a difference to the baseline (metric_spec's `differenced`), in order."""
    return [m.id for m in differenced()]


def by_text() -> dict[str, str]:
    """{metric id: per_text.csv column} of the differenced metrics a one-run pair differences by text."""
    return {m.id: m.per_text for m in differenced() if m.per_text}


def read_per_text(run: dict) -> tuple[dict[int, dict] | None, str]:
    """index -> {column: float} from the run's per-text file; (None, why) when it has none."""
    name = run["metrics"].get("per_text_file")
    if not name:
        return None, f"{run['path']} has no per-text file"
    path = run["path"] / name
    if not path.is_file():
        return None, f"{path} is missing"
    rows: dict[int, dict] = {}
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        paired = by_text()  # the columns a difference by text reads
        optional = {m.per_text for m in SPEC if m.per_text and not m.every_run}  # AIS's: where it ran
        columns = tuple(c for c in per_text_columns() if c not in optional)
        have = reader.fieldnames or []
        # a metric only some tests measure (`every_run` False: AIS) is paired where the file has its column
        needed = ["index", *(c for mid, c in paired.items() if metric(mid).every_run)]
        absent = [c for c in columns if c in needed and c not in have]
        if absent:
            raise CompareError(f"{path}: no column {', '.join(absent)} (expected {','.join(columns)})")
        read = [c for c in paired.values() if c in have]
        for line, row in enumerate(reader, start=2):
            try:
                index = int(row["index"])
                values = {c: float(row[c]) for c in read}
            except (TypeError, ValueError):
                raise CompareError(f"{path}:{line}: not a number in {dict(row)}") from None
            if index in rows:
                raise CompareError(f"{path}:{line}: index {index} occurs twice")
            rows[index] = values
    return rows, ""


DIFFERENT_TEXTS, NOT_COMPARABLE = "different test texts", "not comparable"


def texts_pairing(a: dict, b: dict) -> tuple[tuple[dict, dict] | None, str]:
    """The two runs' per-text rows when they were tested on the same texts; else (None, why)."""
    da, db = a["metrics"].get("test_texts_sha256"), b["metrics"].get("test_texts_sha256")
    if da and db and da != db:  # said first: not comparable, per-text files or not
        return None, f"{DIFFERENT_TEXTS} (test_texts_sha256 {da[:12]}… vs {db[:12]}…)"
    ta, why = read_per_text(a)
    if ta is None:
        return None, why
    tb, why = read_per_text(b)
    if tb is None:
        return None, why
    if not da or not db:
        return None, f"{(a if not da else b)['path']}: metrics.json has no test_texts_sha256"
    if set(ta) != set(tb):
        return None, f"the per-text files have different rows ({len(ta)} vs {len(tb)} texts, {len(set(ta) ^ set(tb))} unmatched)"
    return (ta, tb), ""


def excludes_zero(d: dict) -> bool | None:
    if d.get("lo") is None:
        return None
    return d["lo"] > 0 or d["hi"] < 0


def seed_map(runs: list[dict]) -> dict[int, dict]:
    """seed -> run, for the seeds that occur once in the group."""
    seeds = [r["seed"] for r in runs]
    return {r["seed"]: r for r in runs if r["seed"] is not None and seeds.count(r["seed"]) == 1}


def seeds_text(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds))


def lacks(a: dict, b: dict, mid: str) -> str:
    """Why a seed's pair has no difference of `mid`: the value each side lacks, as recorded (nan, inf) or missing."""
    raw = [r["metrics"].get(metric(mid).key, MISSING) for r in (a, b) if value(r, mid) is None]
    return "/".join(dict.fromkeys("missing" if v is MISSING or v is None else str(v) for v in raw))


def cell_seeds(mid: str, used: list[int], left: list[tuple[int, str]]) -> str:
    """One cell's own n and t where it used fewer seeds than its row: `MI(dataset): n = 2 (seeds 1, 2; ...)`."""
    out = "; ".join(f"seed {s} left out: {why}" for s, why in left)
    t = f", t(0.975, {len(used) - 1}) = {t975(len(used) - 1):.3f}" if len(used) > 1 else ", no interval"
    return f"{metric(mid).header}: n = {len(used)} (seed{'s' * (len(used) > 1)} {seeds_text(used)}; {out}){t}"


def checkpoint(a: dict, b: dict) -> str:
    """Whose checkpoints a by-text interval compares: `seed 1's checkpoint` (one per side)."""
    if a["seed"] is not None and a["seed"] == b["seed"]:
        return f"seed {a['seed']}'s checkpoint"
    name = lambda r: f"seed {r['seed']}" if r["seed"] is not None else r["path"].name  # noqa: E731
    return f"checkpoints {name(a)} vs {name(b)}"


def texts_clash(a: list[dict], b: list[dict]) -> str:
    """Empty when the runs of both sides that record test_texts_sha256 all record the same one (runs
    from before it was recorded count as tested on those texts); else the digests of each side."""
    da, db = texts_digests(a), texts_digests(b)
    if len({*da, *db}) < 2:
        return ""
    return "test_texts_sha256 " + " vs ".join("/".join(f"{d[:12]}…" for d in ds) or "not recorded" for ds in (da, db))


def means_only(g: dict, base: dict, why: str) -> dict:
    """Each metric's difference of the two rows' means, without an interval (`why` says why)."""
    out = {}
    for mid in diff_ids():
        m, bm = g["stats"][mid]["mean"], base["stats"][mid]["mean"]
        out[mid] = {"diff": None if None in (m, bm) else m - bm, "why": why}
    return out


def not_comparable(g: dict, base: dict, clash: str) -> tuple[dict, str, str]:
    """The differences of the rows' means, without intervals: their runs were tested on other texts."""
    out = means_only(g, base, OTHER_TEXTS)
    line = f"{OTHER_TEXTS}: not comparable ({clash}); difference of the means, no interval"
    return out, MISSING, line


def differences(g: dict, base: dict) -> tuple[dict, str, str]:
    """({metric id: difference}, short pairing for the table, what was paired and n: one line after "ROW: ")."""
    blabel = base["label"]
    rows, brows = g["runs"], base["runs"]
    rmap, bmap = seed_map(rows), seed_map(brows)
    common = sorted(set(rmap) & set(bmap))
    out: dict[str, dict] = {}
    if len(rows) > 1 and len(brows) > 1 and len(common) > 1:
        clash = texts_clash([rmap[s] for s in common], [bmap[s] for s in common])
        if clash:
            return not_comparable(g, base, clash)
        cells = []
        for mid in diff_ids():
            used = [s for s in common if value(rmap[s], mid) is not None and value(bmap[s], mid) is not None]
            d = [value(rmap[s], mid) - value(bmap[s], mid) for s in used]
            out[mid] = {**t_interval(d), "by": "seed", "seeds": used} if d else {"diff": None}
            if len(d) == 1:
                out[mid]["why"] = "one common seed has it"
            if used and len(used) < len(common):
                cells.append(cell_seeds(mid, used, [(s, lacks(rmap[s], bmap[s], mid)) for s in common if s not in used]))
        n = len(common)
        dropped = len(rows) + len(brows) - 2 * n
        extra = f"; {dropped} run(s) without a partner of the same seed left out" if dropped else ""
        line = f"paired by seed with {blabel}, seeds {seeds_text(common)} (n = {n}, t(0.975, {n - 1}) = {t975(n - 1):.3f}){extra}"
        return out, f"seed, n={n}", line + "".join(f"; {c}" for c in cells)
    if len(rows) > 1 and len(brows) > 1:
        clash = texts_clash(rows, brows)
        if clash:
            return not_comparable(g, base, clash)
        for mid in diff_ids():
            a = [v for v in (value(r, mid) for r in rows) if v is not None]
            b = [v for v in (value(r, mid) for r in brows) if v is not None]
            if len(a) > 1 and len(b) > 1:
                out[mid] = {**welch_interval(a, b), "by": "welch"}
            else:
                diff = statistics.fmean(a) - statistics.fmean(b) if a and b else None
                out[mid] = {"diff": diff, "why": "fewer than 2 runs of a side have it"}
        why = "no seed in common" if not common else f"only seed {common[0]} in common"
        line = f"not paired ({why}): unpaired Welch interval, {len(rows)} vs {len(brows)} runs (df rounded down)"
        return out, f"unpaired, n={len(rows)}+{len(brows)}", line
    # One run on at least one side: that run against the other side's run of the same seed.
    if len(rows) == 1 and len(brows) == 1:
        pair = (rows[0], brows[0])
    elif common:
        pair = (rmap[common[0]], bmap[common[0]])
    else:
        pair = None
    if pair is None:
        clash = texts_clash(rows, brows)
        if clash:
            return not_comparable(g, base, clash)
        out = means_only(g, base, "no pairing")
        own = seeds_text(sorted({r["seed"] for r in rows if r["seed"] is not None})) or "unknown"
        runs_text = f"{len(rows)} run{'s' * (len(rows) > 1)} (seed{'s' * (',' in own)} {own})"
        line = f"not paired: {runs_text} and no {blabel} run of the same seed; difference of the means, no interval"
        return out, MISSING, line
    a, b = pair
    which = f"seed {a['seed']}" if a["seed"] is not None else a["path"].name
    bwhich = f"seed {b['seed']}" if b["seed"] is not None else b["path"].name
    # the row's other runs (a row of several against one baseline run) are not in its difference
    others = [str(r["seed"]) if r["seed"] is not None else r["path"].name for r in rows if r is not a]
    seeds_left_out = f"seed{'s' * (len(others) > 1)} {', '.join(others)}"
    left_out = f"; {len(others)} run(s) without a partner of the same seed left out ({seeds_left_out})" if others else ""
    texts, why = texts_pairing(a, b)
    paired = by_text()
    other_texts = why.startswith(DIFFERENT_TEXTS)  # a Monte-Carlo s.e. beside it would read as its error
    for mid in diff_ids():
        va, vb = value(a, mid), value(b, mid)
        ta, tb = texts if texts is not None else ({}, {})
        col = paired.get(mid)
        if col is not None and texts is not None and all(col in r for r in (*ta.values(), *tb.values())):
            d = [ta[i][col] - tb[i][col] for i in sorted(ta) if math.isfinite(ta[i][col]) and math.isfinite(tb[i][col])]
            out[mid] = {**t_interval(d), "by": "text"} if d else {"diff": None, "why": f"{col} is nan for every text"}
            continue
        out[mid] = {
            "diff": None if None in (va, vb) else va - vb,
            "n": 1,
            "why": NOT_COMPARABLE if other_texts else "one run per side",
        }
        se = metric(mid).mc_se
        if se and not other_texts and None not in (value(a, se), value(b, se)):
            out[mid]["mc_se"] = math.hypot(value(a, se), value(b, se))
    head = f"{which} vs {blabel} {bwhich}"
    if texts is not None:
        n = out["neg_elbo"].get("n") or 0
        t = f"t(0.975, {n - 1}) = {t975(n - 1):.3f}" if n > 1 else "no interval"
        n_iw = out["iw_nll"].get("n") or 0
        t_iw = f", t(0.975, {n_iw - 1}) = {t975(n_iw - 1):.3f}" if n_iw > 1 else ""
        iw = f"; IW-NLL on the {n_iw} texts both have it for{t_iw}" if n_iw != n else ""
        line = (
            f"{head}: IW-NLL, −ELBO, KL paired by test text of {checkpoint(a, b)} (n = {n} texts, {t}{iw}); "
            "MI, MI(dataset), AU, PPL: n/a, one run per side"
        )
        short = f"text ({checkpoint(a, b)}), n={n}"
    else:
        line = f"{head}: not paired by text ({why}); one run per side: differences only, n/a"
        if other_texts:
            line = f"{head}: {NOT_COMPARABLE} ({why}); difference of the two runs' values, no interval"
        short = "one run each"
    return out, short, line + left_out
