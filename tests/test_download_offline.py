"""`seqvae download` without a network: the fetch is made to fail as urllib fails offline (no
real network access); the one error line says so first and names the URL it tried."""

from __future__ import annotations

import errno
import io
import socket
import urllib.error

import pytest

from seqvae import download

PTB = download.SOURCES["ptb"][0]


@pytest.fixture
def opened(monkeypatch):
    """Every URL `_open` is asked for; it raises what `fail(url)` returns (or serves a few bytes)."""
    calls: list[str] = []

    def install(fail):
        def fake_open(url):
            calls.append(url)
            err = fail(url)
            if err is None:
                return io.BytesIO(b" a b c \n")
            raise err

        monkeypatch.setattr(download, "_open", fake_open)
        monkeypatch.setattr(download, "CHECKSUMS", {})  # the few bytes served are no real PTB file
        return calls

    return install


def one_error(capsys, *argv) -> str:
    assert download.main([str(a) for a in argv]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("seqvae download: error: "), err
    return lines[0].removeprefix("seqvae download: error: ")


OFFLINE = {  # what urllib raises offline -> how the error line starts
    "lookup": (urllib.error.URLError(socket.gaierror(-2, "Name or service not known")),
               "no network? cannot look up raw.githubusercontent.com ([Errno -2] Name or service not known) for "),
    "unreachable": (urllib.error.URLError(OSError(errno.ENETUNREACH, "Network is unreachable")),
                    "no network? cannot reach raw.githubusercontent.com ([Errno 101] Network is unreachable) for "),
    "timeout": (TimeoutError("timed out"),
                f"no network? no answer from raw.githubusercontent.com within {download.TIMEOUT} s for "),
    "read timeout": (urllib.error.URLError(TimeoutError("timed out")),
                     f"no network? no answer from raw.githubusercontent.com within {download.TIMEOUT} s for "),
}  # fmt: skip


@pytest.mark.parametrize("case", OFFLINE)
def test_offline_ptb_says_no_network_first_naming_the_url(tmp_path, capsys, opened, case):
    error, start = OFFLINE[case]
    calls = opened(lambda url: error)
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d")
    assert line == start + PTB + "ptb.train.txt", line
    assert "has none of" not in line
    assert calls == [PTB + "ptb.train.txt"]  # the other file names are not tried: no network is no network
    assert not (tmp_path / "d").exists()  # nor a dest it created


def test_offline_drive_corpus_says_no_network(tmp_path, capsys, opened):
    opened(lambda url: OFFLINE["lookup"][0])
    line = one_error(capsys, "yahoo", "--dest", tmp_path / "d")
    assert line.startswith("no network? cannot look up drive.google.com (") and line.endswith(download.SOURCES["yahoo"][0])


def test_refused_connection_is_not_called_no_network(tmp_path, capsys, opened):
    opened(lambda url: urllib.error.URLError(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")))
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d", "--url", "http://127.0.0.1:9/")
    assert line == "cannot connect to 127.0.0.1:9 (connection refused) for http://127.0.0.1:9/ptb.train.txt"


def http_error(url: str, code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError(url, code, {404: "Not Found", 503: "Service Unavailable"}[code], {}, None)


def test_missing_files_still_list_the_names_tried(tmp_path, capsys, opened):
    # online, but the folder has no test split under either name: that is what the line says
    calls = opened(lambda url: http_error(url, 404) if url.endswith("test.txt") else None)
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d")
    assert line == f"{PTB} has none of ptb.test.txt, test.txt (cannot fetch {PTB}test.txt: HTTP Error 404: Not Found)"
    assert calls[-2:] == [PTB + "ptb.test.txt", PTB + "test.txt"]


def test_server_error_is_reported_as_it_is_not_as_missing_files(tmp_path, capsys, opened):
    calls = opened(lambda url: http_error(url, 503))
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d")
    assert line == f"cannot fetch {PTB}ptb.train.txt: HTTP Error 503: Service Unavailable"
    assert len(calls) == 1
