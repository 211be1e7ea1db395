"""Build the small embedded demo corpus in data/demo/ from public-domain Bible verses.

Reads one verse per line (default ../shared/data/web_bible/verses.txt, relative to
the repo root), normalises and tokenises it, keeps verses of 5-40 tokens, drops
exact duplicates, shuffles them with random.Random(seed) and writes disjoint
train/valid/test samples.  Words seen fewer than --min-count times in the train
sample become <unk> in all three splits, so the demo has an explicit unknown
token like PTB.

Processing of each verse, in order:
  1. curly quotes and dashes become ASCII: ’ ‘ -> ',  “ ” -> ",  — – -> -
  2. Unicode NFKC, then lowercase
  3. tokenise: a word is a run of letters/digits, with apostrophes kept only
     *inside* it (god's, don't stay one token); every other non-space character
     is a token of its own, including every hyphen (father - in - law) and
     leading/trailing apostrophes (brothers ' -> brothers ')
  4. tokens are joined by single spaces, one verse per line

Usage (from the repo root):
    python scripts/make_demo_corpus.py
"""

import argparse
import random
import re
import unicodedata
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UNK = "<unk>"
ASCII_MAP = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-", "\u2013": "-"})
TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*|\S")


def tokenise(line):
    """Normalise one verse and return its list of tokens."""
    text = unicodedata.normalize("NFKC", line.translate(ASCII_MAP)).lower()
    return TOKEN.findall(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=REPO.parent / "shared/data/web_bible/verses.txt")
    ap.add_argument("--dest", type=Path, default=REPO / "data/demo")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--n-train", type=int, default=3000)
    ap.add_argument("--n-valid", type=int, default=300)
    ap.add_argument("--n-test", type=int, default=300)
    ap.add_argument("--min-count", type=int, default=2)
    ap.add_argument("--min-len", type=int, default=5)
    ap.add_argument("--max-len", type=int, default=40)
    args = ap.parse_args()

    verses, seen = [], set()
    with open(args.source, encoding="utf-8") as f:
        for line in f:
            toks = tokenise(line)
            key = " ".join(toks)
            if args.min_len <= len(toks) <= args.max_len and key not in seen:
                seen.add(key)
                verses.append(toks)
    print(f"source: {len(verses)} distinct verses of {args.min_len}-{args.max_len} tokens")

    random.Random(args.seed).shuffle(verses)
    sizes = {"train": args.n_train, "valid": args.n_valid, "test": args.n_test}
    if sum(sizes.values()) > len(verses):
        ap.error(f"asked for {sum(sizes.values())} verses, only {len(verses)}")
    splits, start = {}, 0
    for name, n in sizes.items():
        splits[name] = verses[start : start + n]
        start += n

    counts = Counter(t for toks in splits["train"] for t in toks)
    vocab = {w for w, c in counts.items() if c >= args.min_count}
    print(f"vocabulary: {len(vocab) + 1} types ({len(vocab)} words seen >= {args.min_count} times in train, plus {UNK})")

    args.dest.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        lines = [" ".join(t if t in vocab else UNK for t in toks) for toks in rows]
        path = args.dest / f"{name}.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        n_tok = sum(len(toks) for toks in rows)
        n_unk = sum(line.split().count(UNK) for line in lines)
        print(
            f"{name:5s}: {len(lines):5d} lines, {n_tok:6d} tokens, "
            f"{n_tok / len(lines):5.2f} tokens/line, unk rate "
            f"{100 * n_unk / n_tok:5.2f}%, {path.stat().st_size} bytes"
        )


if __name__ == "__main__":
    main()
