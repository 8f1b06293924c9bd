"""A parallel corpus of one's own, prepared for training: the raw cleaning, a joint BPE trained on a
seeded sample, and every kept pair as token ids in compact arrays, made once into a cache and
memory-mapped by each later run, resume and rank.

The cache (``--corpus-cache``; by default ``corpus-cache`` beside the run directory) holds a
folder per set of corpus files, named by a digest of their SHA-256s, and in it:

- ``kept-<rules>.npy``, ``.json``: which lines survive the raw cleaning (``corpus.clean_pairs``:
  an empty side, a duplicate with ``--dedup``) and the counts per reason;
- ``tokenizer-<digest>.model``: the joint BPE for a vocabulary size, sample size and seed;
- ``arrays-<tokenizer>-<rules>/``: the kept pairs' ids, ``src_ids.npy``, ``src_offsets.npy``,
  ``tgt_ids.npy``, ``tgt_offsets.npy`` (``batching.FlatSequences``; uint16 ids for a vocabulary
  that fits, else int32), encoded by the tokenizer whose SHA-256 names the folder (the sources
  with its ``encode_batch``, the targets with its ``encode_target_batch``: one model for both in a
  joint BPE, a Marian tokenizer's ``target.spm`` for the targets);
- ``heldout-<rules>-<seed>-<size>.json``: the raw text of the validation pairs taken from the
  training pairs when the run has no ``--valid``.

Each product appears whole under its name (``filecache.cached_product``), so concurrent processes
wait for the first and then read. Pairs longer than ``max_len`` or beyond the length ratio are
dropped later, from the lengths (``ParallelData``): the arrays do not depend on them.

The tokenizer's sample is drawn here, not by sentencepiece's ``input_sentence_size``: with the
same seed, that one gives a different model in each process, and a cache needs the same one.
"""

import array
import dataclasses
import hashlib
import itertools
import json
from pathlib import Path

import numpy

from ...common import filecache
from .batching import FlatSequences
from .corpus import CleaningReport, CorpusError, clean_pairs, held_out, read_pairs
from .tokenizer import Tokenizer

__all__ = ["PreparedCorpus", "prepare_corpus", "heldout_text", "read_text", "default_cache_dir"]

FORMAT = 1  # the layout of the arrays; a new one makes new cache entries
ENCODE_CHUNK = 20_000  # pairs encoded at a time


@dataclasses.dataclass
class PreparedCorpus:
    """The kept pairs of a corpus as ids (``src``, ``tgt``: FlatSequences), the ``tokenizer`` that
    encoded them (a joint ``Tokenizer``, or the ``MarianTokenizer`` of a run handed one), the raw
    cleaning's ``report`` and ``kept`` mask of the files' lines, and ``folder``, the cache entry of
    these files."""

    files: object
    tokenizer: object
    src: FlatSequences
    tgt: FlatSequences
    report: CleaningReport
    kept: numpy.ndarray
    folder: Path
    dedup: bool

    def __len__(self):
        return len(self.src)


def default_cache_dir(save_dir):
    """``corpus-cache`` beside the run directory: the runs kept together share prepared corpora."""
    return Path(save_dir).resolve().parent / "corpus-cache"


def _digest(value, size=16):
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:size]


def _rules(dedup):
    return "dedup" if dedup else "all"


def prepare_corpus(files, fingerprints, cache_dir, vocab_size, sample_size, seed=0, dedup=False, tokenizer=None,
                   echo=print):
    """The PreparedCorpus of ``files`` (``corpus.CorpusFiles``; ``fingerprints``, their SHA-256 by
    path, ``corpus.file_fingerprints``), from the cache in ``cache_dir`` or made there now.
    ``tokenizer``: the run's own (a resumed run, or one handed a tokenizer, such as the ``--init-from``
    run's of either kind); else the joint BPE of ``vocab_size`` pieces trained on at most
    ``sample_size`` of the kept sentences, drawn with ``seed``."""
    folder = Path(cache_dir) / _digest({"files": sorted(fingerprints.values()), "tsv": files.target is None,
                                        "format": FORMAT})
    known = folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if not known:
        (folder / "files.json").write_text(json.dumps(fingerprints, indent=1), encoding="utf-8")
    rules = _rules(dedup)
    # One process prepares what is missing while the others wait, then read it all from the cache.
    with filecache.locked(folder / f"prepare-{rules}.lock"):
        made, report, kept, tokenizer, arrays = _products(folder, files, rules, vocab_size, sample_size, seed,
                                                          tokenizer, echo)
    src, tgt = (FlatSequences(numpy.load(arrays / f"{side}_ids.npy", mmap_mode="r", allow_pickle=False),
                              numpy.load(arrays / f"{side}_offsets.npy", allow_pickle=False))
                for side in ("src", "tgt"))
    if not made:
        where = f"read from the cache in {folder}"
    elif not known:
        where = f"prepared into {folder} (the cache held none made from these files' SHA-256)"
    else:
        where = f"prepared into {folder} (new there: the {', the '.join(made)} of these settings)"
    echo(f"{files.option}: {files.describe()}: {report.describe()}; {where}")
    return PreparedCorpus(files, tokenizer, src, tgt, report, kept, folder, dedup)


def _products(folder, files, rules, vocab_size, sample_size, seed, tokenizer, echo):
    """(what had to be made, the cleaning's report, the kept mask, the tokenizer, the arrays'
    folder): each from the cache entry ``folder``, made there first where it is missing."""
    made = []  # "cleaning", "tokenizer", "arrays"

    def note(what, make):
        def making(partial):
            made.append(what)
            return make(partial)
        return making

    kept_path = filecache.cached_product(folder, f"kept-{rules}.npy",
                                         note("cleaning", lambda p: _clean(files, rules == "dedup", p)))
    kept = numpy.load(kept_path, mmap_mode="r", allow_pickle=False)
    report = CleaningReport(**json.loads(kept_path.with_suffix(".json").read_text(encoding="utf-8")))
    if not report.kept:
        raise CorpusError(f"{files.option}: {files.describe()}: no pair is left after cleaning ({report.describe()})")
    if tokenizer is None:
        spec = _digest({"vocab_size": vocab_size, "sample_size": sample_size, "seed": seed, "rules": rules})
        path = filecache.cached_product(folder, f"tokenizer-{spec}.model",
                                        note("tokenizer", lambda p: _train_tokenizer(files, kept, vocab_size,
                                                                                      sample_size, seed, p, echo)))
        tokenizer = Tokenizer.load(path)
    arrays = filecache.cached_product(folder, f"arrays-{tokenizer.sha256[:16]}-{rules}",
                                      note("arrays", lambda p: _encode(files, kept, tokenizer, p, echo)))
    return made, report, kept, tokenizer, arrays


def _clean(files, dedup, partial):
    """Which lines of ``files`` the raw cleaning keeps, as a bool array (its counts in a file beside)."""
    report, number, kept_numbers = CleaningReport(), [-1], array.array("q")

    def numbered():
        for number[0], pair in enumerate(read_pairs(files)):
            yield pair

    for _ in clean_pairs(numbered(), report, dedup=dedup):
        kept_numbers.append(number[0])  # clean_pairs hands on a kept pair as soon as it has read it
    kept = numpy.zeros(report.read, dtype=bool)
    kept[numpy.frombuffer(kept_numbers, dtype=numpy.int64)] = True
    numpy.save(partial, kept)
    counts = partial.with_suffix(".json")
    counts.write_text(json.dumps(dataclasses.asdict(report)), encoding="utf-8")
    counts.replace(partial.parent.parent / counts.name)  # before the array appears, which says both are there


def _kept_pairs(files, kept):
    """The pairs of ``files`` that the cleaning kept, in order."""
    return itertools.compress(read_pairs(files), kept)


def _train_tokenizer(files, kept, vocab_size, sample_size, seed, partial, echo):
    """The joint BPE on the kept sources, then the kept targets (as the built-in data sets train
    it), or on a seeded sample of ``sample_size`` of those sentences."""
    count = int(kept.sum())
    chosen = None
    if 2 * count > sample_size:
        chosen = numpy.zeros(2 * count, dtype=bool)
        chosen[numpy.random.default_rng(seed).choice(2 * count, sample_size, replace=False)] = True
    echo(f"{files.option}: training a joint BPE tokenizer ({vocab_size} pieces) on "
         + (f"{sample_size:,} of the {2 * count:,} sentences, sampled with seed {seed}" if chosen is not None
            else f"{count:,} sentence pairs"))

    def side(index):
        return (pair[index] for pair in _kept_pairs(files, kept))

    sentences = itertools.chain(side(0), side(1))
    if chosen is not None:
        sentences = itertools.compress(sentences, chosen)
    Tokenizer.train(sentences, partial.parent, vocab_size=vocab_size, name=partial.stem)  # writes ``partial``


def _encode(files, kept, tokenizer, partial, echo):
    """Every kept pair's ids into the arrays of a FlatSequences per side, ENCODE_CHUNK pairs at a time: the
    sources through ``tokenizer.encode_batch``, the targets through ``encode_target_batch``."""
    dtype = numpy.uint16 if len(tokenizer) <= numpy.iinfo(numpy.uint16).max + 1 else numpy.int32
    sides = {"src": ([], []), "tgt": ([], [])}
    encoders = {"src": tokenizer.encode_batch, "tgt": tokenizer.encode_target_batch}
    pairs = _kept_pairs(files, kept)
    while chunk := list(itertools.islice(pairs, ENCODE_CHUNK)):
        for index, name in enumerate(sides):
            encoded = encoders[name]([pair[index] for pair in chunk])
            lengths = numpy.fromiter(map(len, encoded), dtype=numpy.int64, count=len(encoded))
            sides[name][0].append(numpy.fromiter(itertools.chain.from_iterable(encoded), dtype=dtype,
                                                 count=int(lengths.sum())))
            sides[name][1].append(lengths)
    partial.mkdir()
    for name, (ids, lengths) in sides.items():
        lengths = numpy.concatenate(lengths) if lengths else numpy.zeros(0, dtype=numpy.int64)
        numpy.save(partial / f"{name}_ids.npy", numpy.concatenate(ids) if ids else numpy.zeros(0, dtype=dtype))
        numpy.save(partial / f"{name}_offsets.npy", numpy.concatenate([[0], numpy.cumsum(lengths)]).astype(numpy.int64))


def heldout_text(prepared, size, seed):
    """(positions among the kept pairs, (sources, targets)) of the ``size`` pairs held out for
    validation from a corpus given without ``--valid`` (``corpus.held_out``), cached."""
    positions = held_out(len(prepared), size, seed)
    name = f"heldout-{_rules(prepared.dedup)}-{seed}-{size}.json"

    def make(partial):
        wanted = numpy.zeros(len(prepared), dtype=bool)
        wanted[positions] = True
        pairs = list(itertools.compress(_kept_pairs(prepared.files, prepared.kept), wanted))
        partial.write_text(json.dumps([list(side) for side in zip(*pairs)]), encoding="utf-8")

    sources, targets = json.loads(filecache.cached_product(prepared.folder, name, make).read_text(encoding="utf-8"))
    return positions, (sources, targets)


def read_text(files):
    """(sources, targets) of ``files`` as they are (a validation or test set: nothing dropped)."""
    sources, targets = [], []
    for source, target in read_pairs(files):
        sources.append(source)
        targets.append(target)
    return sources, targets
