"""Checkpoints: one pickle-free ``.npz`` per save, written atomically, with JSON metadata.

A checkpoint holds the model's parameters (``model/<dotted name>``), Adam's
moments (``adam/m/<i>``, ``adam/v/<i>``) and a JSON document (``metadata``:
config, step, optimiser and schedule state, RNG state, tokenizer hash, ...).
It is written to a temporary file in the same directory and renamed into
place, so a save killed half-way leaves the previous checkpoint untouched; it
is read with ``allow_pickle=False``, so loading one never runs code.
"""

import json
import os
import re
import tempfile
from pathlib import Path

import numpy

__all__ = ["save_checkpoint", "load_checkpoint", "list_checkpoints", "average_checkpoints",
           "prune_checkpoints", "CheckpointError"]

_NAME = re.compile(r"checkpoint_(\d+)\.npz$")


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or inconsistent."""


def _atomic_write_npz(path, arrays):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            numpy.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_checkpoint(path, model_state, metadata, adam_state=None):
    """Write ``model_state`` ({name: array}), Adam's state and ``metadata`` to ``path`` atomically."""
    arrays = {f"model/{k}": numpy.asarray(v) for k, v in model_state.items()}
    meta = dict(metadata)
    if adam_state is not None:
        adam_meta = {k: v for k, v in adam_state.items() if k not in ("m", "v")}
        adam_meta["has_moment"] = [m is not None for m in adam_state["m"]]
        meta["adam"] = adam_meta
        for i, (m, v) in enumerate(zip(adam_state["m"], adam_state["v"])):
            if m is not None:
                arrays[f"adam/m/{i}"], arrays[f"adam/v/{i}"] = m, v
    arrays["metadata"] = numpy.frombuffer(json.dumps(meta).encode("utf-8"), dtype=numpy.uint8)
    _atomic_write_npz(path, arrays)
    return Path(path)


def load_checkpoint(path):
    """(model_state, metadata, adam_state or None) from a checkpoint written by ``save_checkpoint``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with numpy.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        metadata = json.loads(bytes(arrays.pop("metadata")).decode("utf-8"))
    except (OSError, ValueError, KeyError, EOFError) as error:
        raise CheckpointError(f"cannot read checkpoint {path}: {error}") from error
    model_state = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
    adam_state = None
    if "adam" in metadata:
        adam_state = dict(metadata["adam"])
        flags = adam_state.pop("has_moment")
        adam_state["m"] = [arrays[f"adam/m/{i}"] if has else None for i, has in enumerate(flags)]
        adam_state["v"] = [arrays[f"adam/v/{i}"] if has else None for i, has in enumerate(flags)]
    return model_state, metadata, adam_state


def checkpoint_path(directory, step):
    return Path(directory) / f"checkpoint_{step:07d}.npz"


def list_checkpoints(directory):
    """The ``checkpoint_<step>.npz`` files in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.search(p.name))]
    return [p for _, p in sorted(found)]


def prune_checkpoints(directory, keep_last):
    """Delete all but the newest ``keep_last`` step checkpoints; returns the deleted paths."""
    paths = list_checkpoints(directory)
    doomed = paths[:-keep_last] if keep_last > 0 else []
    for p in doomed:
        p.unlink()
    return doomed


def average_checkpoints(paths, output):
    """Average the parameters of ``paths`` element-wise (§6.1) into ``output``.

    All must have the same parameter names and shapes and the same tokenizer.
    The result carries the newest checkpoint's metadata (without optimiser state,
    which has no meaning for an average) and lists its sources.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise CheckpointError("average_checkpoints: no checkpoints given")
    states, metas = [], []
    for p in paths:
        state, meta, _ = load_checkpoint(p)
        states.append(state)
        metas.append(meta)
    reference = states[0]
    for p, state, meta in zip(paths, states, metas):
        if state.keys() != reference.keys() or any(state[k].shape != reference[k].shape for k in state):
            raise CheckpointError(f"average_checkpoints: {p} does not have the parameters of {paths[0]}")
        if meta.get("tokenizer_sha256") != metas[0].get("tokenizer_sha256"):
            raise CheckpointError(f"average_checkpoints: {p} was trained with a different tokenizer than {paths[0]}")
    averaged = {}
    for name, first in reference.items():
        total = numpy.zeros(first.shape, dtype=numpy.float64)
        for state in states:
            total += state[name]
        averaged[name] = (total / len(states)).astype(first.dtype)
    newest = max(zip(metas, paths), key=lambda mp: mp[0].get("step", 0))[0]
    meta = {k: v for k, v in newest.items() if k not in ("adam", "rng_state")}
    meta["averaged_from"] = [p.name for p in paths]
    return save_checkpoint(output, averaged, meta)
