"""A run checkpoint's metadata as today's tinyformer reads it, whatever version wrote it: the
checkpoint compatibility rules, all of them, keyed on the metadata's ``format`` tag.

Every checkpoint of a run carries ``"format": FORMAT`` (``state.run_metadata`` writes it). Within
that format, later versions added fields and moved one; ``migrate`` brings the metadata of an older
writer to today's fields, giving what it left out the meaning it had then:

* ``model_config``: ``label_smoothing`` (held before it moved to the loss, whose setting is
  ``TrainConfig.label_smoothing``) is dropped; ``final_norm``, ``init``, ``activation``, the two
  depths, ``scale_embedding`` and ``logits_bias``, added later, are the models such checkpoints
  hold: no final LayerNorm after a post-LN stack, Xavier initialisation, ReLU, num_layers in both
  stacks, embeddings scaled by √d_model, no bias on the logits;
* ``config``: ``paper``, added later, is True (every preset was the paper's model then); read with
  the checkpoint's model_config (``migrate_config``), the choices the paper does not make
  (``nn.PAPER_CHOICES``) are pinned in ``model_overrides`` where the preset now builds others, so
  that a run resumes as the model it trained, whatever a later version made of its preset;
* ``skipped_updates`` and ``train_seconds`` (the training seconds of the run by the checkpoint's
  step), added later, are 0: a run resumed from such a checkpoint counts its time from there.

A format tag this version does not know is refused (``CheckpointError``) rather than misread;
metadata without one (not written by a run) is read as the first format.
``TransformerConfig.from_dict`` still accepts the ``label_smoothing`` key of an older model_config,
as its public API promises, for dicts read by hand.
"""

from ..checkpoint import CheckpointError
from ...common.validation import json_type
from ...model.nn import TransformerConfig
from ...model.nn.presets import PAPER_CHOICES, PRESETS, preset_config

__all__ = ["FORMAT", "migrate", "migrate_config", "migrate_model_config", "check_metadata_types", "METADATA_TYPES"]

FORMAT = "tinyformer-checkpoint-1"

#: model_config keys of older checkpoints that are no setting of the model any more
MOVED_OUT_OF_MODEL_CONFIG = ("label_smoothing",)
#: model_config fields added after the first checkpoints, with the values their models have
ADDED_TO_MODEL_CONFIG = {"final_norm": None, "init": "xavier", "activation": "relu", "encoder_layers": None,
                         "decoder_layers": None, "scale_embedding": True, "logits_bias": False}


def migrate_model_config(values):
    """A checkpoint's ``model_config`` with today's fields (a new dict)."""
    values = {k: v for k, v in values.items() if k not in MOVED_OUT_OF_MODEL_CONFIG}
    return {**values, **{k: v for k, v in ADDED_TO_MODEL_CONFIG.items() if k not in values}}


def migrate_config(values, model_config=None):
    """A checkpoint's ``config`` (TrainConfig's fields) with today's fields (a new dict); with the
    checkpoint's ``model_config``, the paper's open choices pinned to that model's where its preset
    now builds others."""
    values = {"paper": True, **values}
    if model_config and values.get("preset") in PRESETS:
        overrides = values.get("model_overrides") or {}
        trained = TransformerConfig.from_dict(migrate_model_config(model_config))
        built = preset_config(values["preset"], trained.src_vocab_size or 1, paper=values["paper"], **overrides)
        pinned = {name: getattr(trained, name) for name in PAPER_CHOICES
                  if getattr(trained, name) != getattr(built, name)}
        if pinned:
            values["model_overrides"] = {**overrides, **pinned}
    return values


def _within_format_1(meta):
    meta = dict(meta)
    if isinstance(meta.get("model_config"), dict):
        meta["model_config"] = migrate_model_config(meta["model_config"])
    if isinstance(meta.get("config"), dict):
        meta["config"] = migrate_config(meta["config"])
    meta.setdefault("skipped_updates", 0)
    meta.setdefault("train_seconds", 0.0)
    return meta


_MIGRATIONS = {FORMAT: _within_format_1}  # {format tag: its metadata -> today's}

#: the JSON type of each metadata field any version wrote (None: the field may be null)
METADATA_TYPES = {"format": (str,), "model_config": (dict,), "config": (dict,), "step": (int,), "epoch": (int,),
                  "batch_in_epoch": (int,), "tokens_seen": (int,), "skipped_updates": (int,),
                  "train_seconds": (int, float), "rng_state": (dict,), "rng_states": (list,),
                  "tokenizer_sha256": (str, None), "tokenizer_file": (str, None), "saved_at": (str,),
                  "grad_scaler": (dict,), "adam": (dict,), "averaged_from": (list,), "imported_from": (dict,)}
_TYPE_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
               None: "null"}


def check_metadata_types(meta, path):
    """A CheckpointError naming the file and the field where checkpoint ``path``'s metadata holds a JSON
    value of another type than its writers put there (a list, a string or null where an object belongs)."""
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {path}: its metadata is a JSON {json_type(meta)}, where an object belongs")
    for key, kinds in METADATA_TYPES.items():
        if key not in meta:
            continue
        value = meta[key]
        fits = any(value is None if kind is None else isinstance(value, kind) and not isinstance(value, bool)
                   for kind in kinds)
        if not fits:
            wanted = " or ".join(_TYPE_NAMES[kind] for kind in kinds)
            raise CheckpointError(f"checkpoint {path}: its metadata's {key} is a JSON {json_type(value)}, "
                                  f"where {wanted} belongs")


def migrate(meta, path):
    """Checkpoint ``path``'s metadata ``meta`` in today's form (a new dict; ``meta`` is left as the
    file holds it). Every reader of a run's checkpoint reads it through here."""
    check_metadata_types(meta, path)
    tag = meta.get("format", FORMAT)
    if not isinstance(tag, str) or tag not in _MIGRATIONS:
        raise CheckpointError(f"checkpoint {path} is in format {tag!r}, which this version of tinyformer "
                              f"does not read (it reads {', '.join(map(repr, _MIGRATIONS))})")
    return _MIGRATIONS[tag](meta)
