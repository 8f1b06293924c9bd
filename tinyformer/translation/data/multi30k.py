"""Multi30k (task 1): English, German and French captions of Flickr30k images, line-aligned.

The nine raw files (``<split>.<lang>.gz``) are looked for, in order, in
``data_dir`` (the folder holding them or a parent holding ``multi30k/``), in
``$TINYFORMER_DATA/multi30k`` and in the user cache (``~/.cache/tinyformer/multi30k``,
or under ``$XDG_CACHE_HOME``); if none has them they are downloaded from the
dataset's repository into the cache. Every copy, local or downloaded, must match
the upstream SHA-256, so a truncated or edited file is an error rather than a
silently different test set. Only the cache is ever written to. Downloads use
HTTPS only (plain HTTP only to the loopback address, which never leaves the
machine), and a redirect to anything else is refused.
"""

import gzip
import hashlib
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from tqdm import tqdm

from ...common.atomic import replacing
from .tokenizer import file_sha256

__all__ = ["SPLITS", "LANGUAGES", "BASE_URL", "SHA256", "NUM_LINES", "ENV_VAR",
           "ChecksumError", "InsecureURLError", "check_url", "default_cache_dir", "find_file", "read_lines",
           "load_multi30k"]

SPLITS = ("train", "val", "test_2016_flickr")
LANGUAGES = ("en", "de", "fr")
BASE_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
ENV_VAR = "TINYFORMER_DATA"

SHA256 = {
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}

NUM_LINES = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}

_TIMEOUT_S = 60
_CHUNK = 1 << 16


def default_cache_dir():
    """``$XDG_CACHE_HOME/tinyformer/multi30k``, or ``~/.cache/tinyformer/multi30k`` without it."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    # The XDG spec says a relative value is invalid and must be ignored.
    root = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return root / "tinyformer" / "multi30k"


def _file_name(split, lang):
    if split not in SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; expected one of {SPLITS}")
    if lang not in LANGUAGES:
        raise ValueError(f"unknown Multi30k language {lang!r}; expected one of {LANGUAGES}")
    return f"{split}.{lang}.gz"


def _candidate_dirs(data_dir, cache_dir):
    """(directory, how it was chosen) in search order; a named directory that is missing is an error."""
    dirs = []
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        if not data_dir.is_dir():
            raise FileNotFoundError(f"data_dir {str(data_dir)!r} is not a directory")
        dirs += [(data_dir, "data_dir"), (data_dir / "multi30k", "data_dir")]
    env = os.environ.get(ENV_VAR)
    if env:
        root = Path(env).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"${ENV_VAR} is {env!r}, which is not a directory "
                                    f"(it should hold multi30k/)")
        dirs.append((root / "multi30k", f"${ENV_VAR}"))
    dirs.append((cache_dir, "cache"))
    return dirs


class ChecksumError(ValueError):
    """A Multi30k file whose SHA-256 is not the expected one."""


def _checksum_error(name, path, expected, actual, downloaded):
    what = (f"the download of {name} into {str(path.parent)!r}" if downloaded
            else f"Multi30k file {str(path)!r}")
    advice = ("nothing was kept; retry, or fetch the file by hand" if downloaded
              else "delete it to have it downloaded again, or replace it with the upstream file")
    return ChecksumError(f"{what} has SHA-256 {actual}, expected {expected} for {name}: {advice}")


def _verify(path, name, expected):
    actual = file_sha256(path)
    if actual != expected:
        raise _checksum_error(name, path, expected, actual, downloaded=False)
    return path


class InsecureURLError(ValueError):
    """A download URL (or a redirect target) that is not HTTPS."""


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def check_url(url, what="download URL"):
    """``url`` if it is ``https://`` (or ``http://`` to the loopback address); else InsecureURLError."""
    parts = urllib.parse.urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme == "https" and host:
        return url
    if scheme == "http" and host in _LOOPBACK:
        return url  # a local server (tests): the bytes never cross a network, and the SHA-256 is checked
    raise InsecureURLError(f"refusing the {what} {url!r}: Multi30k is downloaded over https:// only "
                           "(plain http:// could be altered on the way)")


class _HTTPSOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        check_url(newurl, f"redirect of {req.full_url} to")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url):
    """``urlopen`` that refuses a non-HTTPS URL, before connecting, and a redirect to one."""
    check_url(url)
    return urllib.request.build_opener(_HTTPSOnlyRedirects).open(url, timeout=_TIMEOUT_S)


def _download(url, target, name, expected, progress):
    """Stream ``url`` into a temporary file in the cache, check its SHA-256, then rename it in place."""
    check_url(url)
    target.parent.mkdir(parents=True, exist_ok=True)
    with replacing(target, prefix=f".{name}.", suffix=".part") as out, _open(url) as response:
        digest = hashlib.sha256()
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                  desc=f"Multi30k {name}", disable=not progress, leave=False) as bar:
            for chunk in iter(lambda: response.read(_CHUNK), b""):
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        actual = digest.hexdigest()
        if actual != expected:
            raise _checksum_error(name, target, expected, actual, downloaded=True)
    return target


def find_file(split, lang, data_dir=None, download=True, base_url=BASE_URL, cache_dir=None,
              checksums=None, progress=True):
    """Path of the verified ``<split>.<lang>.gz``, downloading it into the cache if no copy is found.

    ``checksums`` maps file names to hex SHA-256 (default ``SHA256``, the upstream
    files). A copy whose digest differs is a ChecksumError (a ValueError) naming both digests; no
    copy and no download (offline, HTTP error, ``download=False``) is a
    FileNotFoundError listing where it looked and where the files can go. A ``base_url`` that is
    not ``https://`` (nor ``http://`` to the loopback address) is an InsecureURLError (a
    ValueError), raised before anything is looked up, as is a redirect to such a URL.
    """
    name = _file_name(split, lang)
    checksums = SHA256 if checksums is None else checksums
    if name not in checksums:
        raise ValueError(f"checksums has no SHA-256 for {name}")
    expected = checksums[name]
    if download:
        check_url(base_url.rstrip("/") + "/" + name)
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()

    searched = _candidate_dirs(data_dir, cache_dir)
    for directory, _ in searched:
        path = directory / name
        if path.is_file():
            return _verify(path, name, expected)

    url = base_url.rstrip("/") + "/" + name
    if download:
        try:
            return _download(url, cache_dir / name, name, expected, progress)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
            reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)
            failure = f", and downloading {url} failed ({reason})"
            cause = e
    else:
        failure, cause = " (download=False)", None

    looked = "".join(f"\n  {str(d)}  ({why})" for d, why in searched)
    if not os.environ.get(ENV_VAR):
        looked += f"\n  (${ENV_VAR} is not set)"
    raise FileNotFoundError(
        f"Multi30k file {name} not found{failure}. Looked in:{looked}\n"
        f"Put the nine files ({{train,val,test_2016_flickr}}.{{en,de,fr}}.gz from {BASE_URL}) "
        f"into {str(cache_dir)!r}, or into D/multi30k/ for a folder D and set {ENV_VAR}=D "
        f"(or pass data_dir=D).") from cause


def read_lines(path):
    """The lines of a gzip-compressed UTF-8 file, trailing whitespace (and ``\\r``) stripped.

    Lines are split on ``\\n`` only: ``str.splitlines`` would also split at form
    feeds or U+2028 inside a caption and break the alignment between languages.
    Leading and inner whitespace is kept.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{str(path)!r} is not a valid gzip file: {e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{str(path)!r} is not UTF-8 text: {e}") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip() for line in lines]


def load_multi30k(split, src="en", tgt="de", data_dir=None, download=True, *, base_url=BASE_URL,
                  cache_dir=None, checksums=None, progress=True):
    """``(src_lines, tgt_lines)`` of one split, line i of one the translation of line i of the other.

    Files are found as by ``find_file`` (same keyword arguments).
    """
    for lang, role in ((src, "src"), (tgt, "tgt")):
        if lang not in LANGUAGES:
            raise ValueError(f"unknown Multi30k language {role}={lang!r}; expected one of {LANGUAGES}")
    if src == tgt:
        raise ValueError(f"src and tgt are both {src!r}; a translation pair needs two languages")
    options = dict(data_dir=data_dir, download=download, base_url=base_url, cache_dir=cache_dir,
                   checksums=checksums, progress=progress)
    src_path = find_file(split, src, **options)
    tgt_path = find_file(split, tgt, **options)
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise ValueError(f"Multi30k {split} is not line-aligned: {str(src_path)!r} has "
                         f"{len(src_lines)} lines, {str(tgt_path)!r} has {len(tgt_lines)}")
    return src_lines, tgt_lines
