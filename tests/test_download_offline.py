"""`seqvae download` without a network: the socket calls fail as they do offline (a failed name lookup,
no route, no answer), under requests and pooch as they run for real, with no access past this machine;
the one error line says so first and names the URL it tried. Servers that answer badly: a loopback one."""

from __future__ import annotations

import errno
import socket

import pytest
from loopback import LOOPBACK, Server, closed_port, only_loopback

from seqvae.text import download, fetch

PTB = download.PTB


@pytest.fixture(autouse=True)
def asked(monkeypatch):
    """The hosts whose name was looked up (every lookup but the loopback's fails)."""
    return only_loopback(monkeypatch)


@pytest.fixture
def no_route(monkeypatch):
    """Names resolve (to TEST-NET-1, never connected to) and connecting raises `error`: no route, no answer."""

    def install(error: OSError):
        real_lookup, real_connect = socket.getaddrinfo, socket.socket.connect

        def lookup(host, port, *args, **kwargs):
            if host in LOOPBACK:
                return real_lookup(host, port, *args, **kwargs)
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("192.0.2.1", port))]

        def connect(sock, address):
            if address[0] == "192.0.2.1":
                raise error
            return real_connect(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", lookup)
        monkeypatch.setattr(socket.socket, "connect", connect)

    return install


def one_error(capsys, *argv) -> str:
    assert download.main([str(a) for a in argv]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert "error" not in out and len(lines) == 1 and lines[0].startswith("seqvae download: error: "), err
    return lines[0].removeprefix("seqvae download: error: ")


def test_offline_lookup_says_no_network_first_naming_the_url(tmp_path, capsys, asked):
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d")
    host = "raw.githubusercontent.com"
    assert line == f"no network? cannot look up {host} ([Errno -2] Name or service not known) for {PTB}ptb.train.txt"
    assert asked == [host]  # the other file names are not tried: no network is no network
    assert list(tmp_path.iterdir()) == []  # nor a dest it created, nor a temporary folder beside it


NO_ROUTE = {  # what connecting raises offline -> how the error line starts
    "unreachable": (OSError(errno.ENETUNREACH, "Network is unreachable"),
                    "no network? cannot reach raw.githubusercontent.com ([Errno 101] Network is unreachable) for "),
    "timeout": (TimeoutError("timed out"),
                f"no network? no answer from raw.githubusercontent.com within {fetch.TIMEOUT} s for "),
}  # fmt: skip


@pytest.mark.parametrize("case", NO_ROUTE)
def test_no_route_says_no_network(tmp_path, capsys, no_route, case):
    error, start = NO_ROUTE[case]
    no_route(error)
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d")
    assert line == start + PTB + "ptb.train.txt", line
    assert list(tmp_path.iterdir()) == []


def test_no_network_at_all_is_one_line_for_every_mirror(tmp_path, capsys, asked):
    dest = tmp_path / "d"
    dest.mkdir()
    line = one_error(capsys, "yahoo", "--dest", dest)
    drive, paddle = (m.url for m in download.CORPORA["yahoo"].mirrors)
    assert line == (f"no network? all 2 mirrors of yahoo failed: (1) cannot look up drive.google.com ([Errno -2] Name "
                    f"or service not known) for {drive}; (2) cannot look up bj.bcebos.com ([Errno -2] Name or service not "
                    f"known) for {paddle}")  # fmt: skip
    assert asked == ["drive.google.com", "bj.bcebos.com"]
    assert list(tmp_path.iterdir()) == [dest] and list(dest.iterdir()) == []


def test_a_server_that_never_answers(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fetch, "TIMEOUT", 0.3)
    with socket.socket() as silent:  # listens (the kernel accepts the connection) but nobody ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        host = f"127.0.0.1:{silent.getsockname()[1]}"
        line = one_error(capsys, "ptb", "--dest", tmp_path / "d", "--url", f"http://{host}/")
    assert line == f"no network? no answer from {host} within 0.3 s for http://{host}/ptb.train.txt"


def test_refused_connection_is_not_called_no_network(tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}/"
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d", "--url", url)
    assert line == f"cannot connect to {url[7:-1]} (connection refused) for {url}ptb.train.txt"


@pytest.fixture
def server():
    servers = []

    def start(respond):
        servers.append(Server(respond))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def test_missing_files_still_list_the_names_tried(tmp_path, capsys, server):
    # online, but the folder has no test split under either name: that is what the line says
    files = server(lambda path, port: (404, b"", "text/plain") if path.endswith("test.txt") else (200, b" a \n", "text/plain"))
    url = files.url + "/"
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d", "--url", url)
    assert line == f"{url} has none of ptb.test.txt, test.txt (cannot fetch {url}test.txt: HTTP Error 404: Not Found)"
    assert files.seen[-2:] == ["/ptb.test.txt", "/test.txt"]


def test_server_error_is_reported_as_it_is_not_as_missing_files(tmp_path, capsys, server):
    files = server(lambda path, port: (503, b"", "text/plain"))
    line = one_error(capsys, "ptb", "--dest", tmp_path / "d", "--url", files.url + "/")
    assert line == f"cannot fetch {files.url}/ptb.train.txt: HTTP Error 503: Service Unavailable"
    assert files.seen == ["/ptb.train.txt"]
