"""`seqvae download`, offline: fake archives with the real releases' layout, served from file:// URLs
(and a loopback server as Google Drive). The mirrors and checksums: test_download_mirrors.py."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from loopback import Server, closed_port, only_loopback

from seqvae.text import download, fetch

YAHOO = {  # what the jxhe/vae-lagging-encoder yahoo tarball holds (plus a vocab we must ignore)
    "yahoo_data/yahoo.train.txt": b"what is the best way to learn ?\nhow do i fix my car\n",
    "yahoo_data/yahoo.valid.txt": b"where is paris\n",
    "yahoo_data/yahoo.test.txt": b"why is the sky blue\n",
    "yahoo_data/vocab.txt": b"<unk>\n",
}
YELP = {  # label<TAB>text lines must come through untouched
    "yelp_data/yelp.train.txt": b"4\tgreat food , slow service\n0\tnever again\n",
    "yelp_data/yelp.valid.txt": b"2\tit was ok\n",
    "yelp_data/yelp.test.txt": b"3\tnice staff\n",
}
PTB = {  # Mikolov's files start each line with a space; keep it
    "ptb.train.txt": b" aer banknote berlitz \n no it was n't black monday \n",
    "ptb.valid.txt": b" consumers may want to move \n",
    "ptb.test.txt": b" no it was n't \n",
}


@pytest.fixture(autouse=True)
def no_internet(monkeypatch):
    only_loopback(monkeypatch)


def tar_gz(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def zip_(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def splits(files: dict[str, bytes], pattern: str) -> dict[str, bytes]:
    """Expected DEST/<name>/ contents: split file name -> bytes."""
    by_base = {os.path.basename(k): v for k, v in files.items()}
    return {f"{s}.txt": by_base[pattern.format(s)] for s in download.SPLITS}


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = download.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_error(err: str, *needles: str) -> None:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("seqvae download: error:"), err
    for needle in needles:
        assert needle in lines[0]


def test_yahoo_tar_gz(tmp_path, capsys):
    archive = tar_gz(tmp_path / "yahoo.tar.gz", YAHOO)
    dest = tmp_path / "data"
    rc, out, err = run(capsys, "yahoo", "--dest", dest, "--url", archive.as_uri())
    assert (rc, err) == (0, "")
    assert contents(dest / "yahoo") == splits(YAHOO, "yahoo.{}.txt")
    assert os.listdir(dest) == ["yahoo"] and sorted(os.listdir(tmp_path)) == ["data", "yahoo.tar.gz"]  # no temp dir
    for name in ("yahoo.train.txt", "yahoo.valid.txt", "yahoo.test.txt"):  # another source: no checksum applies,
        assert f"{hashlib.sha256(YAHOO['yahoo_data/' + name]).hexdigest()}  {name} from" in out  # ours is shown


def test_yelp_zip_keeps_labels_and_accepts_plain_path(tmp_path, capsys):
    files = {"datasets/" + k: v for k, v in YELP.items()}  # prepare_data.py's datasets/ prefix is fine too
    archive = zip_(tmp_path / "yelp.zip", files)
    rc, _, err = run(capsys, "yelp", "--dest", tmp_path / "d", "--url", archive)
    assert (rc, err) == (0, "")
    assert contents(tmp_path / "d" / "yelp") == splits(YELP, "yelp.{}.txt")
    assert (tmp_path / "d" / "yelp" / "train.txt").read_bytes().startswith(b"4\tgreat food")


def test_ptb_from_folder_of_files(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for name, data in PTB.items():
        (src / name).write_bytes(data)
    rc, out, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", src.as_uri() + "/")
    assert (rc, err) == (0, "")
    assert contents(tmp_path / "d" / "ptb") == splits(PTB, "ptb.{}.txt")
    assert out.count("sha256") == 3


def test_ptb_from_simple_examples_tgz(tmp_path, capsys):
    # Mikolov's simple-examples.tgz layout; extra members and a deeper duplicate name are ignored
    files = {f"./simple-examples/data/{k}": v for k, v in PTB.items()}
    files["./simple-examples/other/deeper/ptb.train.txt"] = b"wrong\n"
    archive = tar_gz(tmp_path / "simple-examples.tgz", files)
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", archive.as_uri())
    assert (rc, err) == (0, "")
    assert contents(tmp_path / "d" / "ptb") == splits(PTB, "ptb.{}.txt")


def test_unreachable_url_fails_cleanly(tmp_path, capsys):
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "keep.txt").write_text("x")
    url = f"http://127.0.0.1:{closed_port()}/x.zip"
    rc, out, err = run(capsys, "yahoo", "--dest", dest, "--url", url)
    assert rc == 1
    assert_one_error(err, url)
    assert os.listdir(dest) == ["keep.txt"]


def test_failure_does_not_leave_a_dest_it_created(tmp_path, capsys):
    dest = tmp_path / "new"
    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--url", (tmp_path / "missing.tar.gz").as_uri())
    assert rc == 1
    assert_one_error(err, "missing.tar.gz")
    assert not dest.exists()


def test_corrupt_archive_fails_cleanly(tmp_path, capsys):
    bad = tmp_path / "yahoo.zip"
    bad.write_bytes(os.urandom(4096))
    dest = tmp_path / "d"
    dest.mkdir()
    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--url", bad.as_uri())
    assert rc == 1
    assert_one_error(err, bad.as_uri())
    assert os.listdir(dest) == []


def test_truncated_archive_fails_cleanly(tmp_path, capsys):
    whole = tar_gz(tmp_path / "whole.tar.gz", {"yahoo_data/yahoo.train.txt": os.urandom(200_000), **YAHOO})
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[:-5000])
    rc, _, err = run(capsys, "yahoo", "--dest", tmp_path / "d", "--url", cut.as_uri())
    assert rc == 1
    assert_one_error(err, cut.as_uri())
    assert not (tmp_path / "d").exists()


def test_missing_split_is_named(tmp_path, capsys):
    files = {k: v for k, v in YAHOO.items() if "valid" not in k}
    archive = tar_gz(tmp_path / "yahoo.tar.gz", files)
    dest = tmp_path / "d"
    dest.mkdir()
    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--url", archive.as_uri())
    assert rc == 1
    assert_one_error(err, "yahoo.valid.txt")
    assert os.listdir(dest) == []


def test_empty_split_fails(tmp_path, capsys):
    archive = zip_(tmp_path / "yelp.zip", {**YELP, "yelp_data/yelp.test.txt": b""})
    rc, _, err = run(capsys, "yelp", "--dest", tmp_path / "d", "--url", archive)
    assert rc == 1
    assert_one_error(err, "yelp.test.txt", "empty")


def test_existing_target_untouched_without_force_replaced_with_force(tmp_path, capsys):
    dest = tmp_path / "d"
    (dest / "yahoo").mkdir(parents=True)
    (dest / "yahoo" / "train.txt").write_bytes(b"old\n")
    archive = tar_gz(tmp_path / "yahoo.tar.gz", YAHOO)

    rc, out, err = run(capsys, "yahoo", "--dest", dest, "--url", archive.as_uri())
    assert (rc, err) == (0, "")
    assert len(out.splitlines()) == 1 and "already exists" in out
    assert contents(dest / "yahoo") == {"train.txt": b"old\n"}

    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive")
    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--url", bad.as_uri(), "--force")
    assert rc == 1  # a failed --force run keeps the old corpus
    assert contents(dest / "yahoo") == {"train.txt": b"old\n"}

    rc, _, err = run(capsys, "yahoo", "--dest", dest, "--url", archive.as_uri(), "--force")
    assert (rc, err) == (0, "")
    assert contents(dest / "yahoo") == splits(YAHOO, "yahoo.{}.txt")
    assert os.listdir(dest) == ["yahoo"]


def test_the_pins_do_not_apply_to_another_source(tmp_path, capsys):
    """--url serves other bytes than the release (here: fake ones); the pinned yahoo md5s would refuse them."""
    archive = tar_gz(tmp_path / "yahoo.tar.gz", YAHOO)
    rc, out, err = run(capsys, "yahoo", "--dest", tmp_path / "d", "--url", archive)
    assert (rc, err) == (0, "")
    assert out.count("sha256 (not checked: --url)") == 3 and "as pinned" not in out
    for split in ("train", "valid", "test"):  # ... but the user is told these are not the published files
        want = download.CORPORA["yahoo"].splits[split].split(":")[1]
        assert f"{split}.txt is NOT (md5 " in out and f"; published {want}) the published yahoo.{split}.txt" in out


def test_another_source_serving_the_release_is_recognised(tmp_path, capsys, monkeypatch):
    """--url on a mirror the list does not know: files equal to the pinned release are said to be it."""
    pins = {s: "md5:" + hashlib.md5(YAHOO[f"yahoo_data/yahoo.{s}.txt"]).hexdigest() for s in ("train", "valid", "test")}
    monkeypatch.setitem(download.CORPORA, "yahoo", dataclasses.replace(download.CORPORA["yahoo"], splits=pins))
    rc, out, err = run(capsys, "yahoo", "--dest", tmp_path / "d", "--url", tar_gz(tmp_path / "y.tar.gz", YAHOO))
    assert (rc, err) == (0, "") and "is NOT" not in out
    assert [line for line in out.splitlines() if " the published " in line] == [
        f"seqvae download: {s}.txt is the published yahoo.{s}.txt" for s in ("train", "valid", "test")
    ]
    rc, out, _ = run(capsys, "yelp", "--dest", tmp_path / "e", "--url", zip_(tmp_path / "y.zip", YELP))
    assert rc == 0 and out.count("sha256 (none published)") == 3 and " the published " not in out


def test_builtin_corpora_are_pinned_where_a_checksum_is_known():
    yahoo, yelp, ptb = (download.CORPORA[n] for n in ("yahoo", "yelp", "ptb"))
    assert yahoo.splits == {"train": "md5:3fb31bad56bae7c65fa084f702398c3b",  # PaddleNLP's
                            "valid": "md5:2680dd89b4fe882359846b5accfb7647", "test": "md5:3e6dcb643282e3543303980f1e21bb9d"}
    assert [m.url for m in yahoo.mirrors] == [download.DRIVE + "13azGlTuGdzWLCmgDmQPmvb_jcexVWX7i",  # He et al.'s first
                                              "https://bj.bcebos.com/paddlenlp/datasets/yahoo-answer-100k.tar.gz"]
    assert yahoo.mirrors[1].archive == "md5:68b88fd3f2cc9918a78047d99bcc6532"
    assert sorted(ptb.splits) == sorted(download.SPLITS) and all(p.startswith("md5:") for p in ptb.splits.values())
    assert yelp.splits is None  # none is known: the sha256 fetched is printed (docs/data.md)


@pytest.fixture
def drive(monkeypatch):
    """A loopback HTTP server treated as Google Drive; `respond(path, port) -> (body, content type)`."""
    servers = []

    def start(respond):
        server = Server(lambda path, port: (200, *respond(path, port)))
        servers.append(server)
        monkeypatch.setattr(fetch, "DRIVE_HOSTS", {"127.0.0.1"})
        return f"{server.url}/uc?export=download&id=abc", server.seen

    yield start
    for server in servers:
        server.close()


def test_google_drive_confirm_form(tmp_path, capsys, drive):
    """Drive answers large files with a virus-scan page whose form must be submitted back."""
    payload = tar_gz(tmp_path / "yahoo.tar.gz", YAHOO).read_bytes()

    def respond(path, port):
        if "confirm=t" in path and "uuid=u-1" in path:
            return payload, "application/octet-stream"
        form = (
            f'<form id="download-form" action="http://127.0.0.1:{port}/download" method="get">'
            '<input type="hidden" name="id" value="abc"><input type="hidden" name="export" value="download">'
            '<input type="hidden" name="confirm" value="t"><input type="hidden" name="uuid" value="u-1">'
            "</form>"
        )
        return f"<html><body>Virus scan warning {form}</body></html>".encode(), "text/html; charset=utf-8"

    url, seen = drive(respond)
    rc, _, err = run(capsys, "yahoo", "--dest", tmp_path / "d", "--url", url)
    assert (rc, err) == (0, "")
    assert seen[1] == "/download?id=abc&export=download&confirm=t&uuid=u-1"
    assert contents(tmp_path / "d" / "yahoo") == splits(YAHOO, "yahoo.{}.txt")


def test_google_drive_page_without_form_is_an_error(tmp_path, capsys, drive):
    quota = b"<html>Too many users have viewed or downloaded this file recently.</html>"
    url, _ = drive(lambda path, port: (quota, "text/html"))
    rc, _, err = run(capsys, "yelp", "--dest", tmp_path / "d", "--url", url)
    assert rc == 1
    assert_one_error(err, "Google Drive", url)
    assert not (tmp_path / "d").exists()


def test_help_names_the_subcommand(capsys):
    with pytest.raises(SystemExit):
        download.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: seqvae download")


GENERIC = {  # PTB as other copies lay it out: train.txt, valid.txt, test.txt
    "train.txt": PTB["ptb.train.txt"],
    "valid.txt": PTB["ptb.valid.txt"],
    "test.txt": PTB["ptb.test.txt"],
}


def test_ptb_generic_names_in_a_zip_and_dev_for_valid(tmp_path, capsys):
    archive = zip_(tmp_path / "penn.zip", {f"penn/{k}": v for k, v in GENERIC.items()} | {"README.txt": b"x\n"})
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", archive)
    assert (rc, err) == (0, "")
    assert contents(tmp_path / "d" / "ptb") == {"train.txt": PTB["ptb.train.txt"], "valid.txt": PTB["ptb.valid.txt"],
                                                "test.txt": PTB["ptb.test.txt"]}  # fmt: skip
    dev = {("dev.txt" if k == "valid.txt" else k): v for k, v in GENERIC.items()}
    archive = tar_gz(tmp_path / "dev.tgz", dev)
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "e", "--url", archive)
    assert (rc, err) == (0, "") and (tmp_path / "e" / "ptb" / "valid.txt").read_bytes() == PTB["ptb.valid.txt"]


def test_release_names_win_over_generic_ones(tmp_path, capsys):
    files = {f"data/{k}": v for k, v in PTB.items()} | {k: b"generic, shallower\n" for k in GENERIC}
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", zip_(tmp_path / "a.zip", files))
    assert (rc, err) == (0, "")
    assert contents(tmp_path / "d" / "ptb") == splits(PTB, "ptb.{}.txt")


def test_archive_of_several_corpora_needs_a_folder(tmp_path, capsys):
    """An archive like PyTorch's word_language_model data/: penn/ and wikitext-2/ both hold train.txt …"""
    files = {f"data/penn/{k}": v for k, v in GENERIC.items()} | {f"data/wikitext-2/{k}": b"w\n" for k in GENERIC}
    archive = zip_(tmp_path / "data.zip", files)
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", archive)
    assert rc == 1
    assert_one_error(err, "several corpora (data/penn/, data/wikitext-2/)", "#DIR")
    assert not (tmp_path / "d").exists()
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", f"{archive.as_uri()}#data/penn")
    assert (rc, err) == (0, "")
    assert (tmp_path / "d" / "ptb" / "train.txt").read_bytes() == PTB["ptb.train.txt"]
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "e", "--url", f"{archive.as_uri()}#data/nope")
    assert rc == 1
    assert_one_error(err, "has no folder 'data/nope'")


def test_archive_missing_one_split_names_that_split_only(tmp_path, capsys):
    files = {"data/train.txt": GENERIC["train.txt"], "data/dev.txt": GENERIC["valid.txt"]}
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", tar_gz(tmp_path / "a.tar.gz", files))
    assert rc == 1
    assert_one_error(err, "has in data/ none of ptb.test.txt, test.txt")
    assert "train" not in err.split("has in data/")[1]  # what is there is not listed as missing


def test_folder_of_generic_files(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for name, data in GENERIC.items():
        (src / name).write_bytes(data)
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "d", "--url", src)
    assert (rc, err) == (0, "")
    assert (tmp_path / "d" / "ptb" / "test.txt").read_bytes() == PTB["ptb.test.txt"]
    (src / "test.txt").unlink()
    rc, _, err = run(capsys, "ptb", "--dest", tmp_path / "e", "--url", src)
    assert rc == 1
    assert_one_error(err, "has none of ptb.test.txt, test.txt")
