"""For the `seqvae download` tests: an HTTP server on 127.0.0.1 in a thread, and a guard that lets no
test reach past this machine (any other host fails its name lookup, as it does without a network)."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from seqvae.text import fetch

LOOPBACK = ("127.0.0.1", "localhost")


def only_loopback(monkeypatch) -> list[str]:
    """Every other host's lookup fails as offline; returns the hosts that were asked for. No retries
    (pooch waits 1 s, 2 s between them); the test of retries sets its own."""
    asked: list[str] = []
    real = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        if host not in LOOPBACK:
            asked.append(host)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # a proxy would be asked for the loopback URLs too
    monkeypatch.setattr(fetch, "RETRIES", 0)
    return asked


class Server:
    """Serves `respond(path, port) -> (status, body, content type, headers)` on a free loopback port;
    `seen` lists the paths asked for."""

    def __init__(self, respond):
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                seen.append(self.path)
                status, body, kind, *extra = respond(self.path, self.server.server_address[1])
                self.send_response(status)
                self.send_header("Content-Type", kind)
                headers = {"Content-Length": str(len(body)), **(extra[0] if extra else {})}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
