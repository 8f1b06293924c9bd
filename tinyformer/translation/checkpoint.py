"""Checkpoints: one pickle-free ``.npz`` per save, written atomically, with JSON metadata.

A checkpoint holds the model's parameters (``model/<dotted name>``), Adam's
moments (``adam/m/<i>``, ``adam/v/<i>``) and a JSON document (``metadata``:
config, step, optimiser and schedule state, RNG state, tokenizer hash, ...); what the metadata
means, whichever version wrote it, is ``train.migration``'s, and averaging is ``train.averaging``.
It is written to a temporary file in the same directory and renamed into
place, so a save killed half-way leaves the previous checkpoint untouched; it
is read with ``allow_pickle=False``, so loading one never runs code. A state
holding NaN or Inf is never written: ``save_checkpoint`` refuses it, naming the array.
Any other file (a pickle, an object array, a truncated, corrupt or foreign file)
is refused on loading with a ``CheckpointError`` naming the file and the problem. The metadata and
every array's header (shape, dtype) are read before any array's data, and the caller's ``check``
sees them first: a model's shape is refused (``nn.limits``) before an array of that size exists.
"""

import json
import re
import zipfile
import zlib
from pathlib import Path

import numpy

from ..common.atomic import replacing
from ..common.files import readable_file

__all__ = ["save_checkpoint", "load_checkpoint", "list_checkpoints", "step_of",
           "prune_checkpoints", "remove_partial_files", "model_config_mismatch", "non_finite", "CheckpointError"]

_NAME = re.compile(r"checkpoint_(\d+)\.npz$")
_PARTIAL = re.compile(r"^checkpoint_\d+\.npz\.[^.]+\.tmp$")  # a temporary of _atomic_write_npz
_ZIP_MAGIC = b"PK\x03\x04"
MAX_METADATA_BYTES = 16 * 2**20  # a run's metadata is a few kilobytes
_HEADER_READERS = {(1, 0): numpy.lib.format.read_array_header_1_0, (2, 0): numpy.lib.format.read_array_header_2_0}


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or inconsistent."""


def _atomic_write_npz(path, arrays):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path, prefix=path.name + ".", durable=True) as f:  # the prefix _PARTIAL knows
        numpy.savez(f, **arrays)


def non_finite(arrays):
    """(name, how many values are NaN or Inf, size) of the first floating-point array of ``arrays``
    ({name: array}) that holds any, or None: what every writer of weights refuses."""
    for key, array in arrays.items():
        array = numpy.asarray(array)
        if array.dtype.kind in "fc":
            finite = numpy.isfinite(array)
            if not finite.all():
                return key, int(array.size - numpy.count_nonzero(finite)), array.size
    return None


def _check_finite(path, arrays):
    """Refuse a state holding NaN or Inf: such a checkpoint would only spread the failure to a resume."""
    found = non_finite(arrays)
    if found is not None:
        key, bad, size = found
        what = (f"parameter {key[len('model/'):]!r}" if key.startswith("model/")
                else f"Adam moment {key!r}" if key.startswith("adam/") else f"array {key!r}")
        raise CheckpointError(f"refusing to write checkpoint {path}: {what} holds {bad} non-finite "
                              f"value(s) (NaN or Inf) of {size}")


def save_checkpoint(path, model_state, metadata, adam_state=None):
    """Write ``model_state`` ({name: array}), Adam's state and ``metadata`` to ``path`` atomically.

    Refuses (CheckpointError, nothing written) a parameter or moment holding NaN or Inf.
    """
    arrays = {f"model/{k}": v for k, v in model_state.items()}
    meta = dict(metadata)
    if adam_state is not None:
        adam_meta = {k: v for k, v in adam_state.items() if k not in ("m", "v")}
        adam_meta["has_moment"] = [m is not None for m in adam_state["m"]]
        meta["adam"] = adam_meta
        for i, (m, v) in enumerate(zip(adam_state["m"], adam_state["v"])):
            if m is not None:
                arrays[f"adam/m/{i}"], arrays[f"adam/v/{i}"] = m, v
    arrays = {k: numpy.asarray(v) for k, v in arrays.items()}
    _check_finite(path, arrays)
    try:
        text = json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"refusing to write checkpoint {path}: its metadata is not plain JSON "
                              f"({error})") from None
    arrays["metadata"] = numpy.frombuffer(text.encode("utf-8"), dtype=numpy.uint8)
    _atomic_write_npz(path, arrays)
    return Path(path)


def load_checkpoint(path, check=None):
    """(model_state, metadata, adam_state or None) from a checkpoint written by ``save_checkpoint``.

    Never unpickles (``allow_pickle=False``). A missing, unreadable, empty, truncated or non-zip file,
    an object (pickled) array, or missing or unreadable metadata is a CheckpointError naming the file
    and what is wrong with it. ``check(metadata, {parameter: (shape, dtype name)})`` sees the metadata
    and the parameters' headers before any parameter's data is read; what it raises stops the reading.
    """
    path = readable_file(path, "checkpoint", CheckpointError)

    def refuse(problem):
        return CheckpointError(f"cannot read checkpoint {path}: {problem}")

    with open(path, "rb") as f:
        head = f.read(len(_ZIP_MAGIC))
    if head != _ZIP_MAGIC:
        what = "the file is empty" if not head else f"it starts with {head!r}"
        raise refuse(f"not a tinyformer checkpoint (an .npz, i.e. zip, file): {what}")
    arrays = {}
    try:
        with numpy.load(path, allow_pickle=False) as npz:
            headers = {key: _array_header(npz.zip, key, refuse) for key in npz.files}
            if "metadata" not in headers:
                raise refuse("no 'metadata' entry: not a tinyformer checkpoint")
            if headers["metadata"][2] > MAX_METADATA_BYTES:
                raise refuse(f"its metadata is {headers['metadata'][2]:,} bytes (a checkpoint's is at most "
                             f"{MAX_METADATA_BYTES:,})")
            metadata = _metadata(npz["metadata"], refuse)
            if check is not None:
                check(metadata, {key[len("model/"):]: (shape, dtype.name)
                                 for key, (shape, dtype, _) in headers.items() if key.startswith("model/")})
            largest = max((size // dtype.itemsize for key, (_, dtype, size) in headers.items()
                           if key.startswith("model/")), default=0)
            for key, (shape, dtype, size) in headers.items():
                # a moment has its parameter's shape
                if key.startswith("adam/") and size // max(dtype.itemsize, 1) > largest:
                    raise refuse(f"array {key!r} declares shape {shape}: more values than any parameter holds")
            for key in npz.files:
                if key.startswith(("model/", "adam/")):  # nothing else is read, whatever it declares
                    arrays[key] = npz[key]
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as error:
        problem = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise refuse(f"the file is truncated or corrupt ({problem})") from error
    model_state = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
    adam_state = None
    if "adam" in metadata:
        try:
            adam_state = dict(metadata["adam"])
            flags = adam_state.pop("has_moment")
            adam_state["m"] = [arrays[f"adam/m/{i}"] if has else None for i, has in enumerate(flags)]
            adam_state["v"] = [arrays[f"adam/v/{i}"] if has else None for i, has in enumerate(flags)]
        except (KeyError, TypeError, ValueError) as error:
            raise refuse(f"its optimiser state is incomplete (missing {error})") from None
    return model_state, metadata, adam_state


def _array_header(archive, key, refuse):
    """(shape, dtype, bytes) of array ``key`` of an open .npz, read from its .npy header alone; an object
    (pickled) array, or one declaring more bytes than the file holds, refused before its data."""
    member = archive.getinfo(key + ".npy")
    with archive.open(member) as f:
        version = numpy.lib.format.read_magic(f)
        if version not in _HEADER_READERS:
            raise refuse(f"array {key!r} is in .npy format {version}, which tinyformer does not write")
        shape, _, dtype = _HEADER_READERS[version](f)
    if dtype.hasobject:
        raise refuse(f"array {key!r} is a pickled object array; checkpoints are read without unpickling "
                     "(allow_pickle=False), so this file was not written by tinyformer")
    size = dtype.itemsize
    for side in shape:
        size *= side
    if size > member.file_size:
        raise refuse(f"the file is truncated or corrupt (array {key!r} declares {size:,} bytes, its entry holds "
                     f"{member.file_size:,})")
    return tuple(shape), dtype, size


def _metadata(array, refuse):
    """The metadata entry's JSON object."""
    try:
        metadata = json.loads(bytes(array).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise refuse(f"its metadata is not JSON ({error})") from None
    if not isinstance(metadata, dict):
        raise refuse(f"its metadata is a JSON {type(metadata).__name__}, not an object")
    return metadata


def model_config_mismatch(saved, expected, ignore=()):
    """The differences of two model configurations but those in ``ignore`` (settings that shape no
    parameter, such as ``tinyformer.translation.train.config.TRAINING_ONLY``), as "key: saved vs expected" strings."""
    keys = sorted((set(saved) | set(expected)) - set(ignore))
    return [f"{k}: {saved.get(k, '(absent)')!r} vs {expected.get(k, '(absent)')!r}"
            for k in keys if saved.get(k) != expected.get(k)]


def checkpoint_path(directory, step):
    return Path(directory) / f"checkpoint_{step:07d}.npz"


def step_of(path):
    """The step of a ``checkpoint_<step>.npz`` file (None for another name)."""
    found = _NAME.search(Path(path).name)
    return int(found.group(1)) if found else None


def list_checkpoints(directory):
    """The ``checkpoint_<step>.npz`` files in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(step_of(p), p) for p in directory.iterdir() if _NAME.search(p.name)]
    return [p for _, p in sorted(found)]


def remove_partial_files(directory):
    """Delete the temporaries a save killed before its rename left behind; returns their paths.

    Only for a directory no other process is saving into (a run's own directory on resume).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    partial = [p for p in directory.iterdir() if _PARTIAL.search(p.name) and p.is_file()]
    for p in partial:
        p.unlink(missing_ok=True)
    return partial


def prune_checkpoints(directory, keep_last):
    """Delete all but the newest ``keep_last`` step checkpoints; returns the deleted paths."""
    paths = list_checkpoints(directory)
    doomed = paths[:-keep_last] if keep_last > 0 else []
    for p in doomed:
        p.unlink()
    return doomed
