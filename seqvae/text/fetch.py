"""One URL into one file, for `seqvae download`: HTTP(S) through pooch (streaming to a temporary file
that is removed on failure, retries, a progress bar on a terminal), Google Drive's confirm page,
local paths, and the one line that says why a fetch failed (no network first).

pooch is imported only when something is fetched, so `seqvae download --help` stays light.
"""

from __future__ import annotations

import errno
import html
import http.client
import re
import shutil
import socket
import sys
import urllib.parse
import urllib.request
from pathlib import Path

TIMEOUT = 60  # seconds without data before a fetch counts as failed
RETRIES = 2  # further tries of a URL after a broken transfer, 1 s then 2 s apart (pooch's retry_if_failed)
DRIVE_HOSTS = {"drive.google.com", "docs.google.com", "drive.usercontent.google.com"}
NO_ROUTE = {errno.ENETUNREACH, errno.ENETDOWN, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL}
HEADERS = {"User-Agent": "seqvae-download"}


class Failure(Exception):
    """A fetch failed; the message names the URL or file and becomes (part of) the single error line.
    `offline` marks the failures that mean this machine has no network (a lookup or route failing, no
    answer) rather than a bad mirror, so a line about several mirrors can say "no network?" once."""

    def __init__(self, reason: str, offline: bool = False):
        super().__init__(("no network? " if offline else "") + reason)
        self.reason, self.offline = reason, offline


class Missing(Failure):
    """The server (or folder) answered that the file is not there: the next name may be."""


def note(line: str) -> None:
    print(f"seqvae download: {line}", flush=True)


def _causes(err: BaseException):
    """err and everything it wraps: requests wraps urllib3's error, which wraps the socket's OSError."""
    seen, todo = set(), [err]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [a for a in getattr(e, "args", ()) if isinstance(a, BaseException)]
        todo += [c for c in (getattr(e, "reason", None), e.__cause__, e.__context__) if isinstance(c, BaseException)]


def why(url: str, err: Exception) -> Failure:
    """The error line for a failed fetch, its cause first: no network (the usual reason a fetch
    fails) is said as such rather than behind a list of the file names tried."""
    try:
        from requests import HTTPError, Timeout
    except ImportError:  # a local copy needs no requests
        HTTPError = Timeout = ()
    host = urllib.parse.urlsplit(url).netloc
    if isinstance(err, HTTPError) and err.response is not None:
        status = err.response.status_code
        line = f"cannot fetch {url}: HTTP Error {status}: {err.response.reason}"
        return Missing(line) if status in (404, 410) else Failure(line)
    if isinstance(err, Timeout):
        return Failure(f"no answer from {host} within {TIMEOUT} s for {url}", offline=True)
    # The socket's own error, not requests' (which are OSErrors too, wrapping it)
    cause = next((c for c in _causes(err) if isinstance(c, OSError) and not type(c).__module__.startswith("requests")), err)
    if isinstance(cause, FileNotFoundError):
        return Missing(f"cannot fetch {url}: {cause}")
    if isinstance(cause, socket.gaierror):
        return Failure(f"cannot look up {host} ({cause}) for {url}", offline=True)
    if isinstance(cause, TimeoutError):  # socket.timeout is TimeoutError
        return Failure(f"no answer from {host} within {TIMEOUT} s for {url}", offline=True)
    if isinstance(cause, OSError) and cause.errno in NO_ROUTE:
        return Failure(f"cannot reach {host} ({cause}) for {url}", offline=True)
    if isinstance(cause, ConnectionRefusedError):
        return Failure(f"cannot connect to {host} (connection refused) for {url}")
    cut = next((c for c in _causes(err) if isinstance(c, http.client.IncompleteRead)), None)  # fewer bytes than said
    if isinstance(cause, ConnectionError) or cut:
        return Failure(f"connection to {host} broke ({cut or cause}) for {url}")
    return Failure(f"cannot fetch {url}: {cause}")


def _past_drive_warning(url: str) -> tuple[str, dict]:
    """The URL that serves the file itself, and the cookies it needs.

    Hand-written because pooch's HTTPDownloader takes whatever the URL answers: for a file it cannot
    virus-scan, Drive answers with a web page instead. Older pages set a download_warning* cookie holding
    the confirm token; current ones carry a form (action drive.usercontent.google.com/download) whose
    hidden inputs (id, export, confirm, uuid) must be sent back."""
    import requests

    with requests.Session() as session, session.get(url, stream=True, timeout=TIMEOUT, headers=HEADERS) as first:
        first.raise_for_status()
        if "text/html" not in first.headers.get("Content-Type", ""):
            return url, {}  # a small file: Drive sends it at once
        page = first.text
        cookies = session.cookies.get_dict()
    form = re.search(r'<form[^>]*\baction="([^"]+)"', page)
    token = next((v for k, v in cookies.items() if k.startswith("download_warning")), None)
    if form:
        fields = re.findall(r'<input[^>]*\bname="([^"]*)"[^>]*\bvalue="([^"]*)"', page)
        query = urllib.parse.urlencode([(k, html.unescape(v)) for k, v in fields])
        return html.unescape(form.group(1)) + "?" + query, cookies
    if token:
        return url + "&confirm=" + urllib.parse.quote(token), cookies
    # quota exceeded, file removed or no longer shared: Drive says so in HTML, not with a status code
    raise Failure(f"Google Drive sent a web page instead of the file for {url}")


class _Downloader:
    """pooch's HTTPDownloader, past Drive's warning page first; says when pooch retries a URL."""

    def __init__(self):
        self.tries = 0

    def __call__(self, url: str, output_file: str, pooch, check_only: bool = False):
        from pooch import HTTPDownloader

        self.tries += 1
        if self.tries > 1:
            note(f"retrying {url} (try {self.tries} of {1 + RETRIES})")
        drive = urllib.parse.urlsplit(url).hostname in DRIVE_HOSTS
        cookies = {}
        if drive:
            url, cookies = _past_drive_warning(url)
        get = HTTPDownloader(progressbar=sys.stderr.isatty(), timeout=TIMEOUT, headers=HEADERS, cookies=cookies)
        get(url, output_file, pooch)
        if drive:  # the confirmed URL answered with a page again
            with open(output_file, "rb") as got:
                if got.read(512).lstrip().lower().startswith((b"<!doctype html", b"<html")):
                    raise Failure(f"Google Drive sent a web page instead of the file for {url}")


def fetch(url: str, path: Path) -> None:
    """Fetch url (http(s), or file: for a local copy) to path, whose folder exists. Nothing is left at
    path on failure: pooch streams into a temporary file beside it and removes that if the transfer breaks."""
    if urllib.parse.urlsplit(url).scheme == "file":
        try:
            shutil.copyfile(urllib.request.url2pathname(urllib.parse.urlsplit(url).path), path)
        except OSError as err:
            raise why(url, err) from None
        return
    try:
        import pooch
    except ImportError as err:
        raise Failure(f"seqvae download needs pooch (pip install 'pooch>=1.8'): {err}") from None
    import requests

    pooch.get_logger().setLevel("WARNING")  # its "Downloading file …" lines: we print our own
    registry = pooch.create(
        path=path.parent, base_url="", registry={path.name: None}, urls={path.name: url}, retry_if_failed=RETRIES
    )
    try:
        # ftp:// and the like: pooch's own downloader for the scheme
        registry.fetch(path.name, downloader=_Downloader() if url.startswith(("http:", "https:")) else None)
    except Failure:
        raise
    except (OSError, ValueError, requests.RequestException) as err:  # requests' errors are OSErrors too
        raise why(url, err) from None
