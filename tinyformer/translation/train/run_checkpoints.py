"""A run's checkpoints: the current step written by rank 0 with every rank's dropout generator
state, the newest ``keep`` kept, and what a stop leaves behind (the newest one, intact, or none).

A checkpoint is written whole or not at all (``checkpoint.save_checkpoint``), so that whatever
stops a run (a divergence, an out-of-memory error, Ctrl-C, a kill) the newest one stays loadable.
"""

from pathlib import Path

from ...engine import random as tf_random
from .. import checkpoint

__all__ = ["RunCheckpoints", "kept_note"]


class RunCheckpoints:
    """The checkpoints of one run in ``save_dir``: ``keep`` kept; ``comm``'s rank 0 (``lead``) writes."""

    def __init__(self, save_dir, keep, comm, lead):
        self.save_dir, self.keep, self.comm, self.lead = Path(save_dir), keep, comm, lead
        self.saved_step = None  # the step of the last checkpoint this run wrote or resumed from

    def path(self, step):
        return checkpoint.checkpoint_path(self.save_dir, step)

    def write(self, step, model, adam, metadata):
        """Checkpoint ``step`` (``metadata(rng_states)``: the run's metadata with every rank's dropout
        generator state): rank 0 writes it and prunes to ``keep``, while the others wait."""
        path = self.path(step)
        rng_states = self.comm.all_gather_object(tf_random.get_rng_state())
        if self.lead:
            checkpoint.save_checkpoint(path, model.state_dict(), metadata(rng_states), adam.state_dict())
            checkpoint.prune_checkpoints(self.save_dir, self.keep)
        self.saved_step = step
        self.comm.barrier(timeout=None)
        return path

    def newest(self):
        """The newest checkpoint in ``save_dir``, or None."""
        newest = checkpoint.list_checkpoints(self.save_dir)[-1:]
        return newest[0] if newest else None

    def note(self):
        """What a stop leaves behind: the newest checkpoint, intact, or none."""
        return kept_note(self.newest())


def kept_note(newest):
    return f"the last checkpoint, {newest}, is intact" if newest else "no checkpoint was written"
