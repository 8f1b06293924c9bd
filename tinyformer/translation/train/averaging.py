"""Checkpoint averaging (§6.1): the parameters of a run's last checkpoints averaged into one
(``tinyformer average``, and ``--average-last N`` at the end of training: ``average_run``)."""

import dataclasses
from pathlib import Path

import numpy

from ..checkpoint import (CheckpointError, list_checkpoints, load_checkpoint, model_config_mismatch, save_checkpoint,
                          step_of)
from .config import TRAINING_ONLY
from .migration import migrate
from .state import load_model

__all__ = ["average_checkpoints", "average_run", "average_and_load", "AveragedModel", "AVERAGED_FILE"]

AVERAGED_FILE = "averaged.npz"  # where --average-last writes the average in the run directory


def average_run(save_dir, count):
    """The newest ``count`` checkpoints of the run in ``save_dir`` (fewer where fewer exist) averaged
    into ``save_dir``/averaged.npz, atomically; returns (its path, the checkpoints averaged)."""
    paths = list_checkpoints(save_dir)[-count:]
    return average_checkpoints(paths, Path(save_dir) / AVERAGED_FILE, ignore=TRAINING_ONLY), paths


@dataclasses.dataclass
class AveragedModel:
    """The average of a run's last checkpoints: its file, its model (eval mode), how many checkpoints
    and the steps of the first and the last."""

    path: Path
    model: object
    count: int
    first_step: int
    last_step: int

    def label(self):
        return f"averaged over the last {self.count} checkpoints (steps {self.first_step}..{self.last_step})"


def average_and_load(save_dir, count, device="cpu", echo=print):
    """``average_run``, said with ``echo`` (and that fewer than ``count`` existed, if so), then the
    averaged model loaded (``state.load_model``) onto ``device``."""
    path, sources = average_run(save_dir, count)
    steps = [step_of(p) for p in sources]
    fewer = f" (only {len(sources)} of --average-last {count} exist)" if len(sources) < count else ""
    echo(f"averaged the last {len(sources)} checkpoints (steps {steps[0]}..{steps[-1]}) into {path}{fewer}")
    return AveragedModel(path, load_model(path, device)[0], len(sources), steps[0], steps[-1])


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
