"""Checkpoint averaging (§6.1): the parameters of a run's last checkpoints averaged into one."""

from pathlib import Path

import numpy

from ..checkpoint import CheckpointError, load_checkpoint, model_config_mismatch, save_checkpoint
from .migration import migrate

__all__ = ["average_checkpoints"]


def average_checkpoints(paths, output, ignore=()):
    """Average the parameters of ``paths`` element-wise (§6.1) into ``output``.

    All must have the same parameter names and shapes, the same tokenizer and the same
    ``model_config`` (as ``migrate`` reads it, whichever version wrote each) but for the settings in
    ``ignore`` (see ``checkpoint.model_config_mismatch``).
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
        metas.append(migrate(meta, p))
    reference = states[0]
    for p, state, meta in zip(paths, states, metas):
        if state.keys() != reference.keys() or any(state[k].shape != reference[k].shape for k in state):
            raise CheckpointError(f"average_checkpoints: {p} does not have the parameters of {paths[0]}")
        if meta.get("tokenizer_sha256") != metas[0].get("tokenizer_sha256"):
            raise CheckpointError(f"average_checkpoints: {p} was trained with a different tokenizer than {paths[0]}")
        differences = model_config_mismatch(meta.get("model_config") or {}, metas[0].get("model_config") or {},
                                            ignore)
        if differences:
            raise CheckpointError(f"average_checkpoints: {p} is another model than {paths[0]} "
                                  f"({'; '.join(differences)})")
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
