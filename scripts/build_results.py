"""Rebuild the generated tables (and figures) of docs/results.md from the committed result files.

    python scripts/build_results.py            # rewrite the tables in place, redraw the figures
    python scripts/build_results.py --no-plots # the tables only
    python scripts/build_results.py --check    # exit 1 naming every stale table or unquotable prose quote (a CI test)
    python scripts/build_results.py docs/x.md  # one page only

Without a page it rebuilds (or checks) the findings page docs/results.md, its per-finding pages
(docs/results/*.md: the long tables a finding links to), and the archived lab notebook
docs/notes/results_lab_2026-12.md, each from its own blocks, and checks the README's quotes (it has
no blocks) against the findings page's and its finding pages' tables: a result the front door
quotes cannot drift from the files either. The findings page and its finding pages may quote one
another's tables; every other page only its own.

A generated block is the output of `seqvae compare ARGS` between two marker lines:

    <!-- compare 'docs/results/yahoo10k/*/seed1' --label dir --plots docs/figures/yahoo10k_table1 -->
    | run | n | IW-NLL | ...
    <!-- /compare -->

`ARGS` may hold `--baseline RUNS`: the block is then each row's difference to those runs with
its 95% interval (e.g. each method's gap to the LM of the same seed:
`'docs/results/yahoo10k_short/*/seed*' --label dir --baseline 'docs/results/yahoo10k_short/lm/seed*'`).
A `<!-- reference_check compare --ref DIR --seqvae DIR -->` block is the table of
`python -m tools.reference compare ...` (another code's runs against seqvae's, Welch intervals);
a `<!-- paper_table docs/results/table1.yaml -->` block that of `python -m seqvae.analysis.paper_table
...` (a published table's rows beside seqvae's runs of the same methods); an `<!-- estimator_gap RUNS
--estimate nll_bar -->` block that of `python -m seqvae.analysis.estimator_gap ...` (two estimates of
one quantity on the same checkpoints, by text and by seed).
A block of the former `scripts/paired_gap.py` (`<!-- paired_gap ... -->`) is an error naming that
replacement.

`--plots DIR` in ARGS redraws that block's figures (not under --check or --no-plots: they need
matplotlib and PNG bytes differ across versions). Paths are relative to the repository root.

The prose around the blocks is written by hand. What is checked of it (here, in both modes): every
difference it quotes with an interval (`+5.56 [-6.05, +17.16]`, a trailing `*` included), every
one-run difference written `+18.50 (one seed, no interval)` (the table's `+18.50 (n/a)`) and every
`mean ± s.d.` (`1.32 ± 0.05`) must appear verbatim in one of the page's generated tables, `−` read
as `-`. So a quoted interval cannot drift from the tables, which cannot drift from the files. It
does not check that the quote is taken from the right row; tests/test_results_doc.py pins a list
of per-run values quoted in the prose to their files.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

from seqvae.analysis import compare, estimator_gap, paper_table

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = "docs/results.md"
# pages with generated tables; the findings page's own pages (docs/results/*.md with blocks) are added by pages()
PAGES = (FINDINGS, "docs/notes/results_lab_2026-12.md", "docs/results/reference_yahoo10k/README.md")
QUOTING = {"README.md": FINDINGS}  # pages without tables: whose tables (and its finding pages') their quotes must be in
# the block kinds: tool name -> its main(argv) (paired_gap: a kind that is gone, named in table()'s error)
TOOLS = {
    "compare": lambda: compare.main,
    "reference_check": lambda: reference_check().main,  # `compare` of another code's runs
    "paper_table": lambda: paper_table.main,  # a published table's rows beside seqvae's runs (docs/results/table1.yaml)
    "estimator_gap": lambda: estimator_gap.main,  # two estimates on the same checkpoints (NLL-bar against IW-NLL)
    "paired_gap": None,
}
BLOCK = re.compile(rf"^<!-- (?P<tool>{'|'.join(TOOLS)}) (?P<args>.+?) -->\n(?P<body>.*?)^<!-- /(?P=tool) -->$", re.M | re.S)
_NUM = r"[+\-−]\d+(?:\.\d+)?"
# What the prose may quote from a table: a difference with its interval, a one-run difference, a mean ± s.d.
QUOTES = (
    (re.compile(rf"{_NUM} \[{_NUM}, {_NUM}\]\*?"), lambda m: m.group(0)),
    (re.compile(rf"({_NUM}) \(one seed, no interval\)"), lambda m: f"{m.group(1)} (n/a)"),
    (re.compile(r"(?<![\w.])[\-−]?\d+\.\d+ ± \d+\.\d+"), lambda m: m.group(0)),
)


def reference_check():
    """The `reference_check` blocks' tool: tools/reference/check.py (the repository's tools package)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tools.reference import check

    return check


def table(args: list[str], where: str, tool: str = "compare") -> str:
    if tool == "paired_gap":  # scripts/paired_gap.py was folded into `seqvae compare --baseline`
        root = args[0] if args else "DIR"
        raise SystemExit(
            f"{where}: paired_gap blocks are gone: use <!-- compare '{root}/*/seed*' --label dir --baseline '{root}/lm/seed*' -->"
        )
    out, err = io.StringIO(), io.StringIO()
    run = TOOLS[tool]()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(args)
    except SystemExit as exit_:  # argparse's usage errors: the usage, then the error line
        code, message = exit_.code or 1, (err.getvalue().strip().splitlines() or [str(exit_.code)])[-1]
    else:
        message = err.getvalue().strip()
    if code != 0:
        raise SystemExit(f"{where}: {tool} {shlex.join(args)} failed: {message}")
    return out.getvalue()


def rebuild(text: str, doc: str, draw: bool) -> tuple[str, list[str]]:
    """The document with every block regenerated, and the marker lines of the blocks that changed."""
    stale, parts, end = [], [], 0
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        args = shlex.split(m["args"])
        if not draw and "--plots" in args:
            i = args.index("--plots")
            args = args[:i] + args[i + 2 :]
        body = table(args, f"{doc}:{line}", m["tool"])
        if body != m["body"]:
            stale.append(f"{doc}:{line}: <!-- {m['tool']} {m['args']} -->")
        parts += [text[end : m.start("body")], body]
        end = m.end("body")
    return "".join(parts) + text[end:], stale


def unquoted(text: str, doc: str = "doc", tables: str | None = None) -> list[str]:
    """The prose's quotes of a table (QUOTES) that no generated table of `text` (or `tables`) contains."""
    if tables is None:
        tables = "\n".join(m["body"] for m in BLOCK.finditer(text))
    missing, end = [], 0
    for m in [*BLOCK.finditer(text), None]:
        prose_start = end
        prose = text[prose_start : m.start() if m else len(text)]
        end = m.end() if m else len(text)
        for pattern, quoted in QUOTES:
            for q in pattern.finditer(prose):
                want = quoted(q).replace("−", "-")
                if want not in tables:
                    line = text.count("\n", 0, prose_start + q.start()) + 1
                    missing.append(f"{doc}:{line}: '{q.group(0)}' is in no generated table (looked for '{want}')")
    return missing


def finding_pages() -> list[str]:
    """The findings page's per-finding pages: docs/results/*.md with generated blocks (its long tables)."""
    return [str(p) for p in sorted(Path("docs/results").glob("*.md")) if BLOCK.search(p.read_text(encoding="utf-8"))]


def pages() -> list[str]:
    return [PAGES[0], *finding_pages(), *PAGES[1:]]


def shared_tables(path: Path) -> str | None:
    """The tables a page's prose may quote besides its own: the findings page and its finding pages quote
    one another's (a finding keeps its key table and links the rest); any other page only its own."""
    group = [FINDINGS, *finding_pages()]
    name = str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)
    if name not in group:
        return None
    return "\n".join(m["body"] for p in group if p != name for m in BLOCK.finditer(Path(p).read_text(encoding="utf-8")))


def one_page(path: Path, check: bool, draw: bool) -> int:
    text = path.read_text(encoding="utf-8")
    if not BLOCK.search(text):
        print(f"{path}: no <!-- compare ... --> blocks", file=sys.stderr)
        return 2
    new, stale = rebuild(text, str(path), draw=draw)
    others = shared_tables(path)
    own = "\n".join(m["body"] for m in BLOCK.finditer(new))
    missing = unquoted(new, str(path), None if others is None else own + "\n" + others)
    for m in missing:
        print(f"prose: {m}", file=sys.stderr)
    if check:
        for s in stale:
            print(f"out of date: {s} (run python scripts/build_results.py)", file=sys.stderr)
        return 1 if stale or missing else 0
    if new != text:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(new, encoding="utf-8")
        tmp.replace(path)  # atomic: an error above leaves the old file whole
    print(f"{path}: {len(BLOCK.findall(new))} tables, {len(stale)} updated")
    return 1 if missing else 0


def quoting_page(path: Path, source: Path) -> int:
    """A page without tables (the README): its quotes must be in `source`'s generated tables."""
    tables = "\n".join(m["body"] for m in BLOCK.finditer(source.read_text(encoding="utf-8")))
    tables += "\n" + (shared_tables(source) or "")
    missing = unquoted(path.read_text(encoding="utf-8"), str(path), tables)
    for m in missing:
        print(f"prose: {m} of {source}", file=sys.stderr)
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = f"{PAGES[0]}, docs/results/*.md, {', '.join(PAGES[1:])}, then the README's quotes"
    parser.add_argument("doc", nargs="?", help=f"one page (default: {every})")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    parser.add_argument("--no-plots", action="store_true", help="rewrite the tables only; leave the figures as they are")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    draw = not (args.check or args.no_plots)
    if args.doc:
        return one_page(Path(args.doc), args.check, draw)
    codes = [one_page(Path(p), args.check, draw) for p in pages()]
    codes += [quoting_page(Path(p), Path(src)) for p, src in QUOTING.items()]
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
