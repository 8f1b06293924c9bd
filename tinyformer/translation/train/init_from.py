"""Fine-tuning: a run that starts from another run's model (``TrainConfig.init_from``), an imported
Marian run's or one that tinyformer trained.

The new run's model is the checkpoint's ``model_config`` (with the run's ``--dropout`` where given)
holding the checkpoint's weights; its tokenizer is the other run's, copied into the new run's
save_dir under the same name (a Marian ``tokenizer/`` folder, or ``spm.model``), so no BPE is
trained and every id the model knows keeps its meaning. Adam and the learning-rate schedule start
afresh, at step 0. A resumed run reads none of this again: its model_config and its tokenizer's
name come from its own newest checkpoint, so the run it started from may since have moved.

Rank 0 reads the checkpoints; the other ranks receive the model_config and the tokenizer's name
(``share``), the tokenizer as files and the weights with the first parameter broadcast, as in any
run.
"""

import dataclasses
import shutil
from pathlib import Path

from .. import checkpoint, distributed
from ..weights import load_weights
from ...common.atomic import new_folder, write_atomically
from ...engine import random as tf_random
from ...model.nn import Transformer
from .state import (_load_state, checked_model_config, migrated_with_model, model_check, run_tokenizer_path,
                    tokenizer_file_of)

__all__ = ["Start", "init_checkpoint", "read_start", "resumed_start", "share", "adopt_tokenizer", "build_model",
           "data_max_len"]


@dataclasses.dataclass
class Start:
    """What a run ``--init-from`` another is built from: rank 0 reads it (``read_start`` for a new run,
    ``resumed_start`` on resume), ``share`` gives the other ranks all but the arrays."""

    model_config: dict      # the model to build (migrated to today's fields)
    tokenizer_file: str     # the name of the tokenizer beside the checkpoints
    tokenizer_sha256: str
    source: str             # the checkpoint read
    state: dict = None      # the weights to start from (rank 0 of a new run)
    loaded: tuple = None    # rank 0 of a resumed run: its newest checkpoint as ``load_checkpoint`` returned it

    @property
    def source_tokenizer(self):
        return Path(self.source).parent / self.tokenizer_file


def init_checkpoint(init_from):
    """The checkpoint ``--init-from`` names: a file as it is, a run directory's newest checkpoint."""
    path = Path(init_from)
    if not path.exists():
        raise FileNotFoundError(f"--init-from: {path} does not exist")
    if path.is_dir():
        found = checkpoint.list_checkpoints(path)
        if not found:
            raise checkpoint.CheckpointError(f"--init-from: no checkpoint_*.npz in {path} (give a run directory "
                                             "or a checkpoint file)")
        return found[-1]
    return path


def read_start(config):
    """The Start of a new run ``--init-from`` a checkpoint or run directory (rank 0): its weights and
    model_config, and its tokenizer's name, checked to be beside it and to be the one it was trained with.
    Refusals name the file; nothing is written."""
    from ..data.tokenizer import tokenizer_sha256

    path = init_checkpoint(config.init_from)
    state, meta, _ = load_weights(path, model_check(path))
    meta = migrated_with_model(meta, path)
    name = tokenizer_file_of(meta)
    start = Start(meta["model_config"], name, meta.get("tokenizer_sha256"), str(path), state)
    found = tokenizer_sha256(start.source_tokenizer)
    if found is None:
        raise FileNotFoundError(f"--init-from: the tokenizer of {path}, {start.source_tokenizer} (its tokenizer_file "
                                f"{name!r}), is missing or incomplete: put the run's tokenizer back beside it")
    if found != start.tokenizer_sha256:
        raise checkpoint.CheckpointError(
            f"--init-from: tokenizer {start.source_tokenizer} (sha256 {found[:12]}...) is not the one {path} was "
            f"trained with (sha256 {str(start.tokenizer_sha256)[:12]}...)")
    return start


def resumed_start(newest):
    """The Start of a resumed run that began ``--init-from`` another (rank 0): its own newest checkpoint,
    read once here and handed on to ``restore_checkpoint`` (``loaded``)."""
    loaded = checkpoint.load_checkpoint(newest, model_check(newest))
    meta = migrated_with_model(loaded[1], newest)
    return Start(meta["model_config"], tokenizer_file_of(meta), meta.get("tokenizer_sha256"), str(newest),
                 loaded=loaded)


def share(comm, start):
    """Rank 0's Start on every rank: its model_config and tokenizer facts (the arrays stay on rank 0)."""
    if comm.size == 1:
        return start
    facts = comm.broadcast_object({"model_config": start.model_config, "tokenizer_file": start.tokenizer_file,
                                   "tokenizer_sha256": start.tokenizer_sha256, "source": start.source}
                                  if comm.rank == 0 else None)
    return start if comm.rank == 0 else Start(**facts)


def adopt_tokenizer(config, start, resume, echo=print):
    """The run's tokenizer (rank 0): on a new run the ``--init-from`` run's, copied into save_dir under its
    name (or found there already, the same one); on resume the copy there (``restore_checkpoint``
    checks it). A save_dir holding another tokenizer under that name is refused."""
    from ..data.tokenizer import load_tokenizer, tokenizer_sha256

    own = run_tokenizer_path(config)
    if not resume and not own.exists():
        _copy_whole(start.source_tokenizer, own)
        echo(f"--init-from: the tokenizer {start.source_tokenizer} copied to {own} (no BPE is trained)")
    elif not resume and tokenizer_sha256(own) != start.tokenizer_sha256:
        raise FileExistsError(f"--save-dir {config.save_dir} already holds {own}, which is not the tokenizer of "
                              f"--init-from {start.source}: choose another --save-dir")
    tokenizer = load_tokenizer(own)
    vocab = start.model_config.get("src_vocab_size")
    if vocab != len(tokenizer):
        raise checkpoint.CheckpointError(f"{start.source}: its model's vocabulary is {vocab}, but its tokenizer "
                                         f"{own} has {len(tokenizer)} pieces")
    return tokenizer


def _copy_whole(source, destination):
    """A tokenizer file or folder copied byte for byte, appearing whole under ``destination``."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        write_atomically(destination, source.read_bytes())
        return
    staging = new_folder(destination.parent, f".{destination.name}.", ".partial")  # mkdir's mode, not mkdtemp's
    try:
        for item in sorted(source.iterdir()):
            if item.is_file():
                shutil.copyfile(item, staging / item.name)
        staging.rename(destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def build_model(config, start, rank=0):
    """The Transformer of ``start``'s model_config, with the run's dropout where given, on the run's
    device; holding the ``--init-from`` weights where ``start`` has them (a new run's rank 0: the other
    ranks receive them, a resumed run restores its own). Restarts the dropout generator on ``rank``'s
    stream for the seed, as ``builders.build_model`` does."""
    values = dict(start.model_config)
    if config.dropout is not None:
        values["dropout"] = config.dropout
    tf_random.manual_seed(distributed.rank_seed(config.seed, rank))
    model = Transformer(checked_model_config(values, start.source))
    if start.state is not None:
        _load_state(model, start.state, f"--init-from {start.source}: its parameters do not fit its model_config")
    return model.to(config.device)


def data_max_len(config, start, echo=print):
    """The longest pair (in tokens, with EOS or BOS) the run trains on: ``--max-len``, but no more than the
    positions of the model it starts from."""
    positions = start.model_config.get("max_len") or config.max_len
    if config.max_len <= positions:
        return config.max_len
    echo(f"--max-len {config.max_len} is more than the {positions} positions of the model of --init-from: "
         f"pairs longer than {positions} tokens are dropped")
    return positions
