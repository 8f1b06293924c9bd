"""What a run's checkpoint holds besides the arrays, and reading it back.

Each checkpoint carries, beside the parameters and Adam's moments, the config, the model's
``model_config``, where the run stands (``Position``), the dropout generator's state and the
tokenizer's SHA-256: all a resumed run needs to continue exactly, and all that ``load_model``
needs to rebuild the model for translation.
"""

import dataclasses
import time
from pathlib import Path

from .. import checkpoint
from ..weights import load_weights
from ...engine import random as tf_random
from ...model.nn import StateDictError, Transformer, TransformerConfig, limits
from .config import TRAINING_ONLY
from .migration import FORMAT, migrate

__all__ = ["Position", "TOKENIZER_FILE", "run_metadata", "restore_checkpoint", "load_model", "migrated_with_model",
           "tokenizer_file_of", "run_tokenizer_path", "checked_model_config", "model_check"]

TOKENIZER_FILE = "spm.model"


@dataclasses.dataclass
class Position:
    """Where a run stands; saved in each checkpoint, so that a resumed run sees the same batches."""

    step: int = 0             # updates applied
    epoch: int = 0            # epochs completed
    batch_in_epoch: int = 0   # batches of this epoch consumed, those of skipped updates too
    tokens_seen: int = 0      # target tokens of the applied updates
    skipped_updates: int = 0  # updates skipped for a non-finite loss or gradient, over the whole run
    train_seconds: float = 0.0  # seconds of training of the whole run by this step (clock.TrainingClock)

    def advance(self, batches, tokens, applied):
        """Past ``batches`` batches of ``tokens`` target tokens, one more step if ``applied``."""
        self.batch_in_epoch += batches
        if applied:
            self.step += 1
            self.tokens_seen += tokens

    def end_epoch_if_done(self, batches_in_epoch):
        if self.batch_in_epoch >= batches_in_epoch:
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    @classmethod
    def from_metadata(cls, meta):
        """The Position of a checkpoint's metadata (``migration.migrate``d)."""
        return cls(meta["step"], meta["epoch"], meta["batch_in_epoch"], meta["tokens_seen"], meta["skipped_updates"],
                   float(meta.get("train_seconds", 0.0)))


def run_metadata(config, model, tokenizer, position, rng_states=None, scaler=None):
    """The JSON metadata of a checkpoint of this run at ``position``; with several ranks,
    ``rng_states`` holds each rank's dropout generator state (``rng_state`` is rank 0's); an fp16
    run's ``scaler`` (optim.GradScaler) its loss scale and counters as ``grad_scaler``."""
    return {
        "format": FORMAT,
        "config": config.to_dict(),
        "model_config": model.config.to_dict(),
        **dataclasses.asdict(position),
        "rng_state": tf_random.get_rng_state(),
        "tokenizer_sha256": tokenizer.sha256,
        "tokenizer_file": Path(tokenizer.path).name if getattr(tokenizer, "path", None) else TOKENIZER_FILE,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **({"rng_states": rng_states} if rng_states is not None and len(rng_states) > 1 else {}),
        **({"grad_scaler": scaler.state_dict()} if scaler is not None and scaler.enabled else {}),
    }


def run_tokenizer_path(config):
    """Where the run of ``config`` keeps its tokenizer: ``spm.model`` in its save_dir, or, for a run
    started ``--init-from`` another, the name that run's tokenizer has (``config.tokenizer_file``)."""
    return Path(config.save_dir) / (config.tokenizer_file or TOKENIZER_FILE)


def restore_checkpoint(path, model, adam, tokenizer, loaded=None):
    """Load checkpoint ``path`` into a freshly built ``model`` and ``adam`` and the dropout
    generator; returns (its Position, its metadata). Refuses (CheckpointError, nothing changed on
    disk) another tokenizer, another architecture and an averaged checkpoint (no optimiser state).
    The metadata is read through ``migration.migrate`` and returned so. ``loaded``: what
    ``checkpoint.load_checkpoint(path)`` returned, where the caller has read it already."""
    state, meta, adam_state = loaded if loaded is not None else checkpoint.load_checkpoint(path)
    meta = migrate(meta, path)
    if meta.get("tokenizer_sha256") != tokenizer.sha256:
        raise checkpoint.CheckpointError(f"{path} was trained with another tokenizer than {tokenizer.path} "
                                         f"(sha256 {str(meta.get('tokenizer_sha256'))[:12]}... there, "
                                         f"{tokenizer.sha256[:12]}... here)")
    saved_model = meta.get("model_config") or {}
    differences = checkpoint.model_config_mismatch(saved_model, model.config.to_dict(), TRAINING_ONLY)
    if differences:
        raise checkpoint.CheckpointError(
            f"{path} holds another model than this run builds ({'; '.join(differences)}; checkpoint vs "
            "run): resume with the run's own settings (tinyformer train --resume reads them from the checkpoint)")
    _load_state(model, state, f"{path}: its parameters do not fit its model_config")
    if adam_state is None:
        raise checkpoint.CheckpointError(f"{path} holds no optimiser state (an averaged checkpoint?): "
                                         "cannot resume from it")
    if "init" in saved_model:  # how these weights were first drawn, whatever the preset says now
        model.config = model.config.replace(init=saved_model["init"])
    schedule = adam.lr
    adam.load_state_dict(adam_state)
    adam.lr = schedule
    tf_random.set_rng_state(meta["rng_state"])
    return Position.from_metadata(meta), meta


def tokenizer_file_of(meta):
    """The name of the run's tokenizer beside its checkpoints: ``spm.model`` (a joint sentencepiece model),
    or the ``tokenizer`` folder of an imported Marian run; a name with a folder in it is refused."""
    name = meta.get("tokenizer_file") or TOKENIZER_FILE
    if not isinstance(name, str) or Path(name).name != name or name in (".", ".."):
        raise checkpoint.CheckpointError(f"a checkpoint's tokenizer_file must be a plain name, got {name!r}")
    return name


def migrated_with_model(meta, path):
    """Checkpoint ``path``'s metadata read through ``migration.migrate``; a CheckpointError naming the file
    when it holds no model_config (not written by a run)."""
    meta = migrate(meta, path)  # which checks the metadata's types
    if not isinstance(meta.get("model_config"), dict):
        raise checkpoint.CheckpointError(f"checkpoint {path} has no model_config in its metadata: it was not "
                                         "written by tinyformer train (or averaged from such checkpoints)")
    return meta


def checked_model_config(values, path):
    """The TransformerConfig of checkpoint ``path``'s ``model_config`` (migrated), refused (CheckpointError
    naming the file and the field) unless it is a model and within ``nn.limits``' bounds: arithmetic only."""
    try:
        config = TransformerConfig.from_dict(values)
    except (TypeError, ValueError) as error:
        raise checkpoint.CheckpointError(f"checkpoint {path}: its model_config cannot be built ({error})") from None
    return limits.check_buildable(config, f"checkpoint {path}: its model_config", checkpoint.CheckpointError)


def model_check(path):
    """The ``check`` of ``load_weights(path, check)`` for a file a model is built from: its metadata's types,
    its model_config within bounds and its parameters' names, shapes and dtypes that config's, all refused
    (CheckpointError naming the file) before any parameter's data is read."""
    def check(meta, declared):
        config = checked_model_config(migrated_with_model(meta, path)["model_config"], path)
        limits.check_tensors(config, declared, f"checkpoint {path}: its parameters do not fit its model_config "
                             f"({_summary(config.to_dict())})", checkpoint.CheckpointError)
    return check


def _summary(model_config):
    return ", ".join(f"{k} {model_config.get(k)}" for k in ("d_model", "d_ff", "heads", "num_layers"))


def load_model(path, device="cpu", tokenizer_path=None):
    """(model in eval mode, tokenizer, metadata) from a checkpoint (or the .safetensors file
    ``tinyformer export`` writes of one, or a run directory: its newest checkpoint); the model is built from the
    metadata read through ``migration.migrate``, the metadata is returned as the file holds it.

    Refuses (CheckpointError naming the file and the mismatch) a file ``load_checkpoint``
    refuses, a tokenizer other than the run's, and parameters that do not fit the checkpoint's
    own ``model_config``.
    """
    from ..data.tokenizer import load_tokenizer

    if Path(path).is_dir():  # a run directory: its newest checkpoint
        found = checkpoint.list_checkpoints(path)
        if not found:
            raise checkpoint.CheckpointError(f"no checkpoint_*.npz in {path}")
        path = found[-1]
    state, meta, _ = load_weights(path, model_check(path))
    model_config = migrated_with_model(meta, path)["model_config"]
    tokenizer_file = tokenizer_file_of(meta)
    tokenizer_path = Path(tokenizer_path) if tokenizer_path else Path(path).parent / tokenizer_file
    tokenizer = load_tokenizer(tokenizer_path)
    expected = meta.get("tokenizer_sha256")
    vocab = model_config.get("src_vocab_size")
    if expected != tokenizer.sha256:
        raise checkpoint.CheckpointError(
            f"tokenizer {tokenizer_path} (sha256 {tokenizer.sha256[:12]}..., {len(tokenizer)} pieces) is not "
            f"the one checkpoint {path} was trained with (sha256 {str(expected)[:12]}..., vocabulary {vocab}): "
            f"pass the run's {tokenizer_file}"
        )
    for key in ("src_vocab_size", "tgt_vocab_size"):
        size = model_config.get(key)
        if size is not None and size != len(tokenizer):
            raise checkpoint.CheckpointError(f"checkpoint {path}: its model's {key} is {size}, but tokenizer "
                                             f"{tokenizer_path} has {len(tokenizer)} pieces")
    model = Transformer(checked_model_config(model_config, path))
    _load_state(model, state, f"checkpoint {path}: its parameters do not fit its model_config "
                f"({_summary(model_config)})")
    return model.to(device).eval(), tokenizer, meta


def _load_state(model, state, context):
    """``model.load_state_dict(state)``; a mismatch becomes a one-line CheckpointError starting with
    ``context`` and naming the first of each kind of disagreement."""
    try:
        model.load_state_dict(state)
    except StateDictError as error:
        shapes = [f"{k} is {saved}, not {shape}" for k, saved, shape in error.mismatched]
        missing = [f"{k} is missing" for k in error.missing]
        unexpected = [f"{k} is not a parameter of the model" for k in error.unexpected]
        parts = [group[0] + (f" (and {len(group) - 1} more like it)" if len(group) > 1 else "")
                 for group in (shapes, missing, unexpected) if group]
        raise checkpoint.CheckpointError(f"{context}: {'; '.join(parts)}") from None
