"""`seqvae download NAME` from its mirrors, each served by a loopback HTTP server in the test: the pinned
checksums, the fall-through to the next mirror, one error line, and --dest as it was after any failure."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from loopback import Server, closed_port, only_loopback

from seqvae.text import download, fetch

SPLIT_TEXT = {"train": b"what is the best way to learn ?\nhow do i fix my car\n", "valid": b"where is paris\n",
              "test": b"why is the sky blue\n"}  # fmt: skip
PINS = {s: "md5:" + hashlib.md5(text).hexdigest() for s, text in SPLIT_TEXT.items()}


def tar_gz(folder: str, text: dict[str, bytes] = SPLIT_TEXT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in {**{f"yahoo.{s}.txt": t for s, t in text.items()}, "vocab.txt": b"_UNK\n"}.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


DRIVE_TAR = tar_gz("yahoo_data")  # He et al.'s layout
PADDLE_TAR = tar_gz("yahoo-answer-100k")  # PaddleNLP's
PADDLE_MD5 = hashlib.md5(PADDLE_TAR).hexdigest()


@pytest.fixture(autouse=True)
def no_internet(monkeypatch):
    only_loopback(monkeypatch)


@pytest.fixture
def serve():
    """`serve({path: body or (status, body, extra headers)})` -> Server; unknown paths are 404."""
    servers = []

    def start(routes):
        def respond(path, port):
            route = routes.get(path, (404, b""))
            status, body, *extra = route if isinstance(route, tuple) else (200, route)
            return status, body, "application/octet-stream", *extra

        servers.append(Server(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def mirrors(monkeypatch, *mirror: download.Mirror, name="yahoo", pins=PINS):
    corpus = download.CORPORA[name]
    monkeypatch.setitem(download.CORPORA, name, download.PublishedCorpus(corpus.pattern, pins, mirror))


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root, with a file's bytes: what "as it was" means."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = download.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seqvae download: error: "), err
    return lines[0].removeprefix("seqvae download: error: ")


@pytest.fixture
def dest(tmp_path):
    """--dest holding another corpus already: a failure must leave it, and everything beside it, as it was."""
    (tmp_path / "data" / "yelp").mkdir(parents=True)
    (tmp_path / "data" / "yelp" / "train.txt").write_bytes(b"0\tkeep me\n")
    return tmp_path / "data"


def test_a_good_mirror_is_checked_and_moved_into_place(tmp_path, capsys, monkeypatch, serve, dest):
    during = []

    class Watch(dict):  # what --dest and its folder hold while the archive is being sent
        def get(self, path, default=None):
            during.append((sorted(p.name for p in dest.iterdir()), sorted(p.name for p in tmp_path.iterdir())))
            return super().get(path, default)

    server = serve(Watch({"/yahoo-answer-100k.tar.gz": PADDLE_TAR}))
    mirrors(monkeypatch, download.Mirror(server.url + "/yahoo-answer-100k.tar.gz", archive="md5:" + PADDLE_MD5))
    rc, out, err = run(capsys, "yahoo", "--dest", dest)
    assert (rc, err) == (0, "")
    assert f"yahoo ready in {dest / 'yahoo'} (checksums as pinned)" in out and "sha256" not in out
    assert {p.name: p.read_bytes() for p in (dest / "yahoo").iterdir()} == {f"{s}.txt": t for s, t in SPLIT_TEXT.items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporary folder left beside it
    (inside, beside), = during  # the download went into a temporary folder beside --dest, not into it
    assert inside == ["yelp"] and len(beside) == 2 and beside[0].startswith(".data.yahoo.partial-")


def test_a_corrupted_archive_is_one_line_with_both_sums_and_dest_as_it_was(tmp_path, capsys, monkeypatch, serve, dest):
    corrupted = PADDLE_TAR[:-1] + bytes([PADDLE_TAR[-1] ^ 1])
    server = serve({"/yahoo-answer-100k.tar.gz": corrupted})
    url = server.url + "/yahoo-answer-100k.tar.gz"
    mirrors(monkeypatch, download.Mirror(url, archive="md5:" + PADDLE_MD5))
    before = tree(tmp_path)
    rc, _, err = run(capsys, "yahoo", "--dest", dest)
    assert rc == 1
    assert one_error(err) == f"checksum mismatch for {url}: md5 {hashlib.md5(corrupted).hexdigest()}, expected {PADDLE_MD5}"
    assert tree(tmp_path) == before


def test_a_changed_split_in_an_unpinned_archive_is_named(tmp_path, capsys, monkeypatch, serve, dest):
    """Nobody publishes the Drive archive's checksum: its split files are checked against the pins."""
    changed = {**SPLIT_TEXT, "train": b"what is the best way to learn ?\n"}
    server = serve({"/uc": tar_gz("yahoo_data", changed)})
    mirrors(monkeypatch, download.Mirror(server.url + "/uc"))
    (dest / "yahoo").mkdir()
    (dest / "yahoo" / "train.txt").write_bytes(b"old\n")
    before = tree(tmp_path)
    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--force")
    assert rc == 1
    got, want = hashlib.md5(changed["train"]).hexdigest(), PINS["train"][4:]
    assert one_error(err) == f"checksum mismatch for yahoo.train.txt from {server.url}/uc: md5 {got}, expected {want}"
    assert tree(tmp_path) == before  # --force keeps the old corpus when the new one fails


def test_a_dead_first_mirror_falls_through_to_the_second(tmp_path, capsys, monkeypatch, serve, dest):
    dead = f"http://127.0.0.1:{closed_port()}/uc"
    server = serve({"/yahoo-answer-100k.tar.gz": PADDLE_TAR})
    good = server.url + "/yahoo-answer-100k.tar.gz"
    mirrors(monkeypatch, download.Mirror(dead), download.Mirror(good, archive="md5:" + PADDLE_MD5))
    rc, out, err = run(capsys, "yahoo", "--dest", dest)
    assert (rc, err) == (0, "")
    assert out.splitlines() == [
        f"seqvae download: fetching yahoo from {dead} (mirror 1 of 2)",
        f"seqvae download: fetching yahoo from {good} (mirror 2 of 2)",
        f"seqvae download: mirror 1 failed: cannot connect to {dead[7:-3]} (connection refused) for {dead}",
        f"seqvae download: yahoo ready in {dest / 'yahoo'} (checksums as pinned)",
    ]
    assert (dest / "yahoo" / "valid.txt").read_bytes() == SPLIT_TEXT["valid"]


def test_every_mirror_failing_is_one_line_with_each_reason(tmp_path, capsys, monkeypatch, serve, dest):
    server = serve({"/yahoo-answer-100k.tar.gz": DRIVE_TAR})  # the other archive: a wrong md5
    missing, wrong = server.url + "/uc", server.url + "/yahoo-answer-100k.tar.gz"
    mirrors(monkeypatch, download.Mirror(missing), download.Mirror(wrong, archive="md5:" + PADDLE_MD5))
    before = tree(tmp_path)
    rc, _, err = run(capsys, "yahoo", "--dest", dest)
    assert rc == 1
    assert one_error(err) == (
        f"all 2 mirrors of yahoo failed: (1) cannot fetch {missing}: HTTP Error 404: Not Found; (2) checksum mismatch "
        f"for {wrong}: md5 {hashlib.md5(DRIVE_TAR).hexdigest()}, expected {PADDLE_MD5}"
    )
    assert tree(tmp_path) == before


def test_a_folder_mirror_is_checked_file_by_file(tmp_path, capsys, monkeypatch, serve):
    text = {f"/ptb.{s}.txt": t for s, t in SPLIT_TEXT.items()}
    server = serve({**text, "/ptb.valid.txt": b"where is rome\n"})
    mirrors(monkeypatch, download.Mirror(server.url + "/"), name="ptb")
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d")
    assert rc == 1
    got = hashlib.md5(b"where is rome\n").hexdigest()
    assert one_error(err) == f"checksum mismatch for ptb.valid.txt from {server.url}/: md5 {got}, expected {PINS['valid'][4:]}"
    assert list(tmp_path.iterdir()) == []


def test_a_broken_transfer_leaves_nothing_and_folders_made_for_it_go(tmp_path, capsys, monkeypatch, serve):
    server = serve({"/uc": (200, DRIVE_TAR[:100], {"Content-Length": str(len(DRIVE_TAR))})})  # closes early
    mirrors(monkeypatch, download.Mirror(server.url + "/uc"))
    rc, _, err = run(capsys, "yahoo", "--dest", tmp_path / "new" / "data")
    assert rc == 1
    assert one_error(err).startswith(f"connection to 127.0.0.1:{server.url.rsplit(':', 1)[1]} broke (")
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary folder, no new/ nor new/data/


def test_a_broken_transfer_is_retried(tmp_path, capsys, monkeypatch, serve):
    monkeypatch.setattr(fetch, "RETRIES", 1)  # pooch waits 1 s before the retry
    served = []

    class Once(dict):  # the first answer breaks off, the second is whole
        def get(self, path, default=None):
            served.append(path)
            return (200, DRIVE_TAR[:100], {"Content-Length": str(len(DRIVE_TAR))}) if len(served) == 1 else DRIVE_TAR

    server = serve(Once())
    mirrors(monkeypatch, download.Mirror(server.url + "/uc"))
    rc, out, err = run(capsys, "yahoo", "--dest", tmp_path / "d")
    assert (rc, err) == (0, "")
    assert f"seqvae download: retrying {server.url}/uc (try 2 of 2)" in out.splitlines()
    assert served == ["/uc", "/uc"]
