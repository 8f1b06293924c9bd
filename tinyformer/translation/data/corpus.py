"""A user's own parallel corpus: finding its files, reading them as aligned pairs, raw cleaning.

A corpus is named the way fairseq's ``--trainpref`` names one: a prefix and two
language codes, ``--train data/train --src en --tgt de`` meaning the files
``data/train.en`` and ``data/train.de`` (each may instead be ``.gz``), line i of
one the translation of line i of the other. A prefix that is itself a file, and
has no such pair beside it, is a tab-separated corpus: ``source<TAB>target`` on
each line.

Files are UTF-8 text, one sentence per line, plain or gzip (recognised by the
file's first two bytes, not its name). They are streamed, never held in memory,
so a WMT-sized corpus (millions of pairs, a gigabyte of text) reads in constant
memory; reading one twice is fine. A line loses its ending (``\\n`` or
``\\r\\n``) and nothing else: spaces, tabs inside a sentence, form feeds and
U+2028 are all kept, and a last line without a newline still counts.

Every bad input (a missing file, a malformed language code, invalid UTF-8, files
of different lengths, a TSV line without exactly one tab, an unreadable or
corrupt file) is a ``CorpusError``: a ValueError whose message is one line that
names the option the corpus came from (``--train``, ``--valid``, ...), the file
and, where there is one, the line number.

``clean_pairs`` then drops pairs with an empty side and, if asked, exact
duplicates, counting each in a ``CleaningReport``; ``held_out`` picks the
validation pairs out of the training corpus when no ``--valid`` is given.
"""

import dataclasses
import gzip
import hashlib
import os
import re
import zlib
from pathlib import Path

import numpy as np

from .tokenizer import file_sha256
from ...common.validation import check_int

__all__ = ["CorpusError", "CorpusFiles", "CleaningReport", "LANGUAGE_CODE", "GZIP_MAGIC", "find_corpus",
           "read_pairs", "count_lines", "clean_pairs", "held_out", "file_fingerprints"]

LANGUAGE_CODE = re.compile(r"[a-z]{2,3}([-_][A-Za-z0-9]+)?")
GZIP_MAGIC = b"\x1f\x8b"

_BLOCK = 1 << 20
_READ_ERRORS = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError


class CorpusError(ValueError):
    """A corpus that cannot be used as given; the message is one line naming the option and the file."""


def _show(path):
    """A path as written in a message: as is, or quoted when it holds a character that would break the line."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def _one_line(text):
    return " ".join(str(text).split())


def _read_error(option, path, error):
    reason = error.strerror if isinstance(error, OSError) and error.strerror else (str(error) or type(error).__name__)
    if isinstance(error, EOFError):
        reason = f"the gzip stream ends early, the file is truncated ({_one_line(reason)})"
    elif isinstance(error, (gzip.BadGzipFile, zlib.error)):
        reason = f"corrupt gzip data ({_one_line(reason)})"
    return CorpusError(f"{option}: cannot read {_show(path)}: {_one_line(reason)}")


@dataclasses.dataclass(frozen=True)
class CorpusFiles:
    """The files of one corpus: a source and a target file, or one tab-separated file (``target`` None)."""

    source: Path
    target: Path | None
    src_lang: str
    tgt_lang: str
    option: str = "--train"

    def __post_init__(self):
        object.__setattr__(self, "source", Path(self.source))
        if self.target is not None:
            object.__setattr__(self, "target", Path(self.target))

    @property
    def is_tsv(self):
        """Whether the corpus is one tab-separated file."""
        return self.target is None

    @property
    def paths(self):
        """The corpus's files: ``(source, target)``, or ``(tsv,)``."""
        return (self.source,) if self.target is None else (self.source, self.target)

    def describe(self):
        """The files in a few characters: ``data/train.{en,de}.gz``, ``corpus.tsv``, or both names in full."""
        if self.target is None:
            return _show(self.source)
        source, target = str(self.source), str(self.target)
        gz = ".gz" if source.endswith(".gz") and target.endswith(".gz") else ""
        source, target = source.removesuffix(gz), target.removesuffix(gz)
        src_end, tgt_end = f".{self.src_lang}", f".{self.tgt_lang}"
        if source.endswith(src_end) and target.endswith(tgt_end):
            prefix = source.removesuffix(src_end)
            if prefix == target.removesuffix(tgt_end):
                return _show(f"{prefix}.{{{self.src_lang},{self.tgt_lang}}}{gz}")
        return f"{_show(self.source)} + {_show(self.target)}"


def _check_language(flag, code):
    if not isinstance(code, str) or not LANGUAGE_CODE.fullmatch(code):
        raise CorpusError(f"{flag} {code!r} is not a language code: expected two or three lowercase letters "
                          f"and an optional variant, such as en, de, pt_BR or zh-Hans")


def _find_side(prefix, lang, option):
    """The path of ``PREFIX.lang`` or else ``PREFIX.lang.gz``, or None; a directory there is an error."""
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.exists():
            if not candidate.is_file():
                what = "a directory" if candidate.is_dir() else "not a regular file"
                raise CorpusError(f"{option}: {_show(candidate)} is {what}, not a corpus file")
            return candidate
    return None


def find_corpus(prefix, src_lang, tgt_lang, option="--train"):
    """The files of the corpus named by ``prefix``, as ``--train PREFIX --src xx --tgt yy`` would name it.

    ``PREFIX.xx`` is used if it exists, else ``PREFIX.xx.gz``; the same for ``yy``, and both sides
    must be found. When neither is found but ``prefix`` is itself a regular file, that file is a
    tab-separated corpus. Anything else (a missing side, a directory, a malformed or repeated
    language code) is a CorpusError naming ``option`` and the paths tried. Only file names are
    looked at here; ``read_pairs`` reads them.
    """
    _check_language("--src", src_lang)
    _check_language("--tgt", tgt_lang)
    if src_lang == tgt_lang:
        raise CorpusError(f"--src and --tgt are both {src_lang!r}; a translation pair needs two languages")
    prefix = os.fspath(prefix)
    if not prefix:
        raise CorpusError(f"{option}: the corpus prefix is empty")
    source = _find_side(prefix, src_lang, option)
    target = _find_side(prefix, tgt_lang, option)
    if source is not None and target is not None:
        return CorpusFiles(source, target, src_lang, tgt_lang, option)
    if source is None and target is None:
        if os.path.isfile(prefix):
            return CorpusFiles(Path(prefix), None, src_lang, tgt_lang, option)
        if os.path.isdir(prefix):
            raise CorpusError(f"{option}: {_show(prefix)} is a directory; give a file prefix such as "
                              f"{_show(os.path.join(prefix, 'train'))} (for train.{src_lang} and train.{tgt_lang}) "
                              f"or a tab-separated file")
        if os.path.exists(prefix):
            raise CorpusError(f"{option}: {_show(prefix)} is not a regular file")
        raise CorpusError(f"{option}: no {_show(f'{prefix}.{src_lang}')} or {_show(f'{prefix}.{src_lang}.gz')}, "
                          f"no {_show(f'{prefix}.{tgt_lang}')} or {_show(f'{prefix}.{tgt_lang}.gz')}, "
                          f"and no tab-separated file {_show(prefix)}")
    found, lang = (source, tgt_lang) if target is None else (target, src_lang)
    raise CorpusError(f"{option}: no {_show(f'{prefix}.{lang}')} or {_show(f'{prefix}.{lang}.gz')} "
                      f"(found {_show(found)} for the other side)")


def _open_binary(path):
    """``path`` opened for reading bytes, decompressed if it starts with the gzip magic bytes."""
    with open(path, "rb") as f:
        magic = f.read(len(GZIP_MAGIC))
    return gzip.GzipFile(path, "rb") if magic == GZIP_MAGIC else open(path, "rb")


def _blocks(path, option):
    """The bytes of ``path`` in blocks of whole lines (the last may lack its newline); a read error becomes a
    CorpusError naming the file."""
    try:
        with _open_binary(path) as f:
            pending = []
            for block in iter(lambda: f.read(_BLOCK), b""):
                end = block.rfind(b"\n") + 1
                if not end:
                    pending.append(block)
                    continue
                pending.append(block[:end])
                yield b"".join(pending)
                pending = [block[end:]]
            rest = b"".join(pending)
            if rest:
                yield rest
    except _READ_ERRORS as e:
        raise _read_error(option, path, e) from None


class _Lines:
    """Iterator over the lines of a corpus file as text, each without its ``\\n`` or ``\\r\\n``.

    A block of lines is decoded at once, twice as fast as line by line. ``count`` is the number
    of lines decoded so far, the file's line count once the iterator is exhausted.
    """

    def __init__(self, path, option):
        self.path, self.option, self.count = path, option, 0
        self._blocks = _blocks(path, option)
        self._lines = self._read()

    def __iter__(self):
        return self._lines

    def close(self):
        """Stop reading and close the file."""
        self._lines.close()
        self._blocks.close()

    def _read(self):
        for block in self._blocks:
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as e:
                raise self._utf8_error(block, e) from None
            lines = text.split("\n")
            unterminated = lines.pop()
            if "\r" in text:
                lines = [line[:-1] if line.endswith("\r") else line for line in lines]
            if unterminated:
                lines.append(unterminated)
            self.count += len(lines)
            yield from lines

    def _utf8_error(self, block, error):
        number = self.count + block.count(b"\n", 0, error.start) + 1
        column = error.start - block.rfind(b"\n", 0, error.start)
        return CorpusError(f"{self.option}: {_show(self.path)} line {number:,} is not UTF-8 text "
                           f"(byte {column}: {error.reason}); convert the file to UTF-8")


def count_lines(path, option="--train"):
    """The number of lines of a corpus file, plain or gzip (a last line without a newline counts)."""
    count, last = 0, b"\n"
    for block in _blocks(path, option):
        count += block.count(b"\n")
        last = block
    return count + (not last.endswith(b"\n"))


def _read_parallel(files):
    source, target = _Lines(files.source, files.option), _Lines(files.target, files.option)
    try:
        yield from zip(source, target)
        for _ in source:
            pass
        for _ in target:
            pass
        if source.count != target.count:
            raise CorpusError(f"{files.option}: {_show(files.source)} has {source.count:,} lines but "
                              f"{_show(files.target)} has {target.count:,}; the two sides must be line-aligned")
    finally:
        source.close()
        target.close()


def _read_tsv(files):
    option, path = files.option, files.source
    lines = _Lines(path, option)
    try:
        for number, line in enumerate(lines, 1):
            pair = line.split("\t")
            if len(pair) != 2:
                found = "no tab" if len(pair) == 1 else f"{len(pair) - 1} tabs"
                raise CorpusError(f"{option}: {_show(path)} line {number:,} has {found}; a tab-separated corpus "
                                  f"needs exactly one per line (source<TAB>target)")
            yield tuple(pair)
    finally:
        lines.close()


def read_pairs(files):
    """The corpus's ``(source, target)`` pairs in file order, streamed.

    Lines are decoded as strict UTF-8 and lose only their ``\\n`` or ``\\r\\n``. The checks are
    made while reading, so a CorpusError (invalid UTF-8, a TSV line without exactly one tab, an
    unreadable or corrupt file, files of different lengths) comes from the iteration, once some
    pairs may have been yielded. Files of different lengths show when the shorter one ends; the
    rest of the longer one is then read to give both line counts.
    """
    return _read_tsv(files) if files.target is None else _read_parallel(files)


@dataclasses.dataclass
class CleaningReport:
    """What ``clean_pairs`` did: pairs read, and pairs dropped for each reason."""

    read: int = 0
    empty: int = 0
    duplicate: int = 0

    @property
    def kept(self):
        """Pairs passed on."""
        return self.read - self.empty - self.duplicate

    def describe(self):
        """One line: ``read 4,500,000 pairs: kept 4,471,002; dropped 12 empty, 28,986 duplicates``."""
        text = f"read {self.read:,} pair{'s' * (self.read != 1)}: kept {self.kept:,}"
        dropped = []
        if self.empty:
            dropped.append(f"{self.empty:,} empty")
        if self.duplicate:
            dropped.append(f"{self.duplicate:,} duplicate{'s' * (self.duplicate != 1)}")
        return text + ("; dropped " + ", ".join(dropped) if dropped else "")


def _pair_digest(source, target):
    # "\n" cannot occur inside a line, so unlike a tab it cannot make two different pairs one string.
    digest = hashlib.blake2b(f"{source}\n{target}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def clean_pairs(pairs, report, dedup=False):
    """The pairs worth training on, unchanged and in order; ``report`` counts what was dropped and why.

    Drops a pair whose source or target is empty or whitespace only (``empty``) and, with
    ``dedup``, an exact repeat of an earlier pair (``duplicate``); every other pair passes as it
    is, leading and trailing spaces included. Deduplication streams too: it keeps an 8-byte
    BLAKE2b digest of each kept pair as an int in a set, about 75 bytes per pair with the set's
    slack (some 330 MB for 4.5 million pairs). Two different pairs share a digest with
    probability below 1e-6 at that size, which would drop the later one; unlike ``hash()``, the
    digest is the same in every run, so such a drop would be too.
    """
    seen = set() if dedup else None
    for source, target in pairs:
        report.read += 1
        if not source or not target or source.isspace() or target.isspace():
            report.empty += 1
            continue
        if seen is not None:
            digest = _pair_digest(source, target)
            if digest in seen:
                report.duplicate += 1
                continue
            seen.add(digest)
        yield source, target


def held_out(count, size, seed):
    """Sorted indices of ``size`` of the ``count`` training pairs, fixed by ``seed``: the validation
    pairs when no ``--valid`` is given (the training corpus then skips them)."""
    count = check_int("count", count, 0)
    size = check_int("size", size, 0)
    seed = check_int("seed", seed, 0)
    if size >= count:
        raise CorpusError(f"--train: the training corpus is too small to hold out {size:,} pairs for validation "
                          f"(it has {count:,}); give --valid or hold out fewer")
    indices = np.random.default_rng(seed).choice(count, size, replace=False)
    return np.sort(indices.astype(np.int64))


def file_fingerprints(files):
    """``{path: hex SHA-256}`` of the corpus's files, to tell whether they changed since a cache was built."""
    fingerprints = {}
    for path in files.paths:
        try:
            fingerprints[str(path)] = file_sha256(path)
        except OSError as e:
            raise _read_error(files.option, path, e) from None
    return fingerprints
