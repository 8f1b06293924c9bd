"""Multi30k: the real files (through $TINYFORMER_DATA), the search order, and downloads from a local server."""

import functools
import gzip
import hashlib
import http.server
import os
import socket
import threading
import urllib.request

import pytest
from ci import in_ci

from tinyformer.translation.data import multi30k
from tinyformer.translation.data.multi30k import (
    NUM_LINES,
    SHA256,
    SPLITS,
    ChecksumError,
    InsecureURLError,
    default_cache_dir,
    find_file,
    load_multi30k,
    read_lines,
)

# Read before the autouse fixture below hides it from every test.
REAL_DATA = os.environ.get("TINYFORMER_DATA")


@pytest.fixture(autouse=True)
def isolated(monkeypatch, tmp_path):
    """No $TINYFORMER_DATA, and a user cache inside tmp_path: no test sees or fills the real ones."""
    monkeypatch.delenv("TINYFORMER_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))


def _real_data():
    if not REAL_DATA:
        if in_ci():
            pytest.fail("CI is set but TINYFORMER_DATA is not: CI must point it at the shared data "
                        "folder holding multi30k/ so that the real-data tests run")
        pytest.skip("TINYFORMER_DATA is not set (a folder holding multi30k/)")
    return REAL_DATA


FIRST_LINES = {
    "train": ("Two young, White males are outside near many bushes.",
              "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."),
    "val": ("A group of men are loading cotton onto a truck",
            "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"),
    "test_2016_flickr": ("A man in an orange hat starring at something.",
                         "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."),
}


@pytest.mark.parametrize("split", SPLITS)
def test_real_files_en_de(split, tmp_path):
    en, de = load_multi30k(split, "en", "de", data_dir=_real_data(), download=False,
                           cache_dir=tmp_path / "cache")
    assert len(en) == len(de) == NUM_LINES[split]
    assert (en[0], de[0]) == FIRST_LINES[split]
    assert all(line and line == line.rstrip() for line in en + de)
    assert not (tmp_path / "cache").exists()                  # found, verified, nothing written


def test_real_files_through_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYFORMER_DATA", _real_data())
    path = find_file("test_2016_flickr", "fr", download=False, cache_dir=tmp_path / "cache")
    assert path.parent.name == "multi30k" and path.name == "test_2016_flickr.fr.gz"
    fr, de = load_multi30k("test_2016_flickr", "fr", "de", download=False,
                           cache_dir=tmp_path / "cache")
    assert len(fr) == len(de) == 1000
    assert de[1] == "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun."


# ------------------------------------------------------------------ fakes and a local server
def _gz(lines):
    """Gzip bytes of lines joined by newlines, with a fixed mtime so the digest repeats."""
    return gzip.compress("".join(line + "\n" for line in lines).encode("utf-8"), mtime=0)


def _put(directory, name, data):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _files(directory):
    return sorted(p.name for p in directory.rglob("*") if p.is_file()) if directory.exists() else []


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A local HTTP server over tmp_path/served: (base URL, folder, stop())."""
    for name in ("no_proxy", "NO_PROXY"):              # an http_proxy must not catch 127.0.0.1
        monkeypatch.setenv(name, "*")
    root = tmp_path / "served"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02},
                              daemon=True)
    thread.start()
    stopped = []

    def stop():
        if not stopped:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
            stopped.append(True)

    yield f"http://127.0.0.1:{httpd.server_address[1]}/raw/", root / "raw", stop
    stop()


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ downloads
def test_download_verifies_lands_in_the_cache_and_is_reused(server, tmp_path):
    url, served, stop = server
    data = _gz(["Ein Mann.", "Zwei Hunde."])
    digest = _put(served, "val.de.gz", data)
    cache = tmp_path / "cache"
    path = find_file("val", "de", base_url=url, cache_dir=cache, checksums={"val.de.gz": digest},
                     progress=False)
    assert path == cache / "val.de.gz" and path.read_bytes() == data
    assert _files(cache) == ["val.de.gz"]                         # no temporary file left
    stop()                                                        # a second call must not download
    assert find_file("val", "de", base_url=url, cache_dir=cache,
                     checksums={"val.de.gz": digest}) == path
    assert read_lines(path) == ["Ein Mann.", "Zwei Hunde."]


def test_download_into_the_default_cache(server, tmp_path):
    url, served, _ = server
    digest = _put(served, "train.fr.gz", _gz(["Un homme."]))
    path = find_file("train", "fr", base_url=url, checksums={"train.fr.gz": digest}, progress=False)
    assert path == tmp_path / "xdg-cache" / "tinyformer" / "multi30k" / "train.fr.gz"


def test_corrupted_download_raises_and_keeps_nothing(server, tmp_path):
    url, served, _ = server
    expected = _put(served, "train.en.gz", _gz(["A man."]))
    _put(served, "train.en.gz", _gz(["A man, edited."]))
    actual = hashlib.sha256((served / "train.en.gz").read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError, match="train.en.gz") as info:
        find_file("train", "en", base_url=url, cache_dir=cache,
                  checksums={"train.en.gz": expected}, progress=False)
    assert expected in str(info.value) and actual in str(info.value)
    assert isinstance(info.value, ValueError)
    assert _files(cache) == []


@pytest.mark.parametrize("failure", ["404", "server down"])
def test_failed_download_says_where_to_put_the_files(failure, server, tmp_path):
    url, _, stop = server
    if failure == "server down":
        stop()
        url = f"http://127.0.0.1:{_closed_port()}/raw/"
    cache = tmp_path / "cache"
    with pytest.raises(FileNotFoundError) as info:
        find_file("test_2016_flickr", "de", data_dir=tmp_path, base_url=url, cache_dir=cache,
                  progress=False)
    message = str(info.value)
    assert "test_2016_flickr.de.gz" in message and url in message
    assert "404" in message if failure == "404" else "refused" in message.lower()
    assert str(tmp_path) in message and str(cache) in message           # where it looked
    assert "TINYFORMER_DATA=" in message and "multi30k/" in message     # where the files can go
    assert _files(cache) == []


def test_no_download_when_told_not_to(server, tmp_path):
    url, served, _ = server
    _put(served, "val.en.gz", _gz(["x"]))
    with pytest.raises(FileNotFoundError, match="download=False"):
        find_file("val", "en", base_url=url, download=False, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ HTTPS only
@pytest.mark.parametrize("base_url", [
    "http://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/",
    "HTTP://example.org/raw/", "ftp://example.org/raw/", "file:///etc/", "//example.org/raw/",
    "https:///raw/", "example.org/raw/",
])
def test_a_download_url_that_is_not_https_is_refused_before_connecting(base_url, tmp_path, monkeypatch):
    def connect(*args, **kwargs):
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", connect)
    monkeypatch.setattr(socket, "create_connection", connect)
    with pytest.raises(InsecureURLError, match=r"refusing the download URL '.*val\.en\.gz': Multi30k is "
                                               r"downloaded over https:// only") as info:
        load_multi30k("val", "en", "de", base_url=base_url, cache_dir=tmp_path / "cache", progress=False)
    assert isinstance(info.value, ValueError) and base_url.rstrip("/") in str(info.value)
    assert not (tmp_path / "cache").exists()


def test_the_upstream_url_is_https():
    assert multi30k.check_url(multi30k.BASE_URL) == multi30k.BASE_URL
    assert multi30k.BASE_URL.startswith("https://")


class _Redirect(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "http://example.invalid/raw" + self.path)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_redirect_away_from_https_is_refused(tmp_path, monkeypatch):
    """The loopback server (plain HTTP is allowed to it) redirects to a plain-HTTP host: refused."""
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.setenv(name, "*")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/raw/"
        with pytest.raises(InsecureURLError, match=r"refusing the redirect of .*val\.de\.gz to "
                                                   r"'http://example\.invalid/raw/raw/val\.de\.gz'"):
            find_file("val", "de", base_url=url, cache_dir=tmp_path / "cache", progress=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    assert _files(tmp_path / "cache") == []


# ------------------------------------------------------------------ local copies
def test_search_order_data_dir_then_environment_then_cache(monkeypatch, tmp_path):
    data = _gz(["Ein Mann."])
    digest = {"val.de.gz": hashlib.sha256(data).hexdigest()}
    direct, parent, env, cache = (tmp_path / n for n in ("direct", "parent", "env", "cache"))
    for folder in (direct, parent / "multi30k", env / "multi30k", cache):
        _put(folder, "val.de.gz", data)
    monkeypatch.setenv("TINYFORMER_DATA", str(env))
    before = _files(tmp_path)
    kw = dict(checksums=digest, cache_dir=cache, download=False)
    assert find_file("val", "de", data_dir=direct, **kw) == direct / "val.de.gz"
    assert find_file("val", "de", data_dir=parent, **kw) == parent / "multi30k" / "val.de.gz"
    assert find_file("val", "de", **kw) == env / "multi30k" / "val.de.gz"
    monkeypatch.delenv("TINYFORMER_DATA")
    assert find_file("val", "de", **kw) == cache / "val.de.gz"
    assert _files(tmp_path) == before                             # reading never writes


def test_local_copy_with_a_wrong_checksum_is_an_error(tmp_path):
    _put(tmp_path / "multi30k", "train.de.gz", _gz(["Ein Mann."]))
    with pytest.raises(ChecksumError, match="train.de.gz.*delete it") as info:
        find_file("train", "de", data_dir=tmp_path, cache_dir=tmp_path / "cache")
    assert SHA256["train.de.gz"] in str(info.value)
    assert not (tmp_path / "cache").exists()


def test_missing_directories_are_named(monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="data_dir.*nowhere"):
        find_file("val", "en", data_dir=tmp_path / "nowhere", cache_dir=tmp_path)
    monkeypatch.setenv("TINYFORMER_DATA", str(tmp_path / "gone"))
    with pytest.raises(FileNotFoundError, match="TINYFORMER_DATA.*gone"):
        find_file("val", "en", cache_dir=tmp_path)


def test_default_cache_dir_honours_xdg(monkeypatch, tmp_path):
    assert default_cache_dir() == tmp_path / "xdg-cache" / "tinyformer" / "multi30k"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "tinyformer" / "multi30k"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")        # invalid per the XDG spec
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "tinyformer" / "multi30k"


# ------------------------------------------------------------------ reading pairs
def test_load_strips_trailing_whitespace_only_and_splits_on_newlines_only(tmp_path):
    de = ["Ein Mann steht. ", "  Zwei\tFrauen\u2028lachen.\r", "Nummer\xa06 \x0c läuft."]
    en = ["A man stands.", "Two women laugh.", "Number 6 runs."]
    sums = {"val.de.gz": _put(tmp_path, "val.de.gz", _gz(de)),
            "val.en.gz": _put(tmp_path, "val.en.gz", _gz(en))}
    src, tgt = load_multi30k("val", "de", "en", data_dir=tmp_path, checksums=sums,
                             cache_dir=tmp_path / "cache")
    assert src == ["Ein Mann steht.", "  Zwei\tFrauen\u2028lachen.", "Nummer\xa06 \x0c läuft."]
    assert tgt == en


def test_mismatched_line_counts_name_both_files(tmp_path):
    sums = {"train.en.gz": _put(tmp_path, "train.en.gz", _gz(["a", "b", "c"])),
            "train.de.gz": _put(tmp_path, "train.de.gz", _gz(["a", "b"]))}
    with pytest.raises(ValueError, match=r"train\.en\.gz' has 3 lines.*train\.de\.gz' has 2"):
        load_multi30k("train", data_dir=tmp_path, checksums=sums, cache_dir=tmp_path / "cache")


def test_unreadable_file_is_named(tmp_path):
    data = b"not gzip at all"
    sums = {"val.en.gz": _put(tmp_path, "val.en.gz", data), "val.de.gz": "0" * 64}
    path = find_file("val", "en", data_dir=tmp_path, checksums=sums, cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="val.en.gz.*not a valid gzip"):
        read_lines(path)
    bad_utf8 = tmp_path / "latin1.gz"
    bad_utf8.write_bytes(gzip.compress("Männer\n".encode("latin-1")))
    with pytest.raises(ValueError, match="latin1.gz.*not UTF-8"):
        read_lines(bad_utf8)


@pytest.mark.parametrize("call, match", [
    (lambda: find_file("training", "en"), r"split 'training'.*'train', 'val', 'test_2016_flickr'"),
    (lambda: find_file("train", "cs"), r"language 'cs'.*'en', 'de', 'fr'"),
    (lambda: load_multi30k("val", "en", "cz"), r"tgt='cz'.*'en', 'de', 'fr'"),
    (lambda: load_multi30k("val", "de", "de"), "src and tgt are both 'de'"),
    (lambda: load_multi30k("dev"), r"split 'dev'"),
    (lambda: find_file("val", "en", checksums={}), "no SHA-256 for val.en.gz"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_checksums_cover_every_file():
    assert set(SHA256) == {f"{s}.{lang}.gz" for s in SPLITS for lang in multi30k.LANGUAGES}
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in SHA256.values())
    assert multi30k.BASE_URL.endswith("/data/task1/raw/")
