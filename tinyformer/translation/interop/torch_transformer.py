"""PyTorch ``nn.Transformer`` state dicts in and out: tinyformer's Transformer as a PyTorch module's weights.

The layout is the state dict of the module ``benchmarks/torch_transformer.py`` builds
(``build_torch_model``), so a model trained in PyTorch can be studied here and sent back. A PyTorch
user's module matches it when its ``state_dict()`` has exactly these keys (d = d_model, V = the one
shared vocabulary, f = d_ff, L = max_len; i counts each stack's layers from 0):

* ``embed.weight`` (V, d): the one embedding of source and target, and the output projection
  (logits = h @ embed.weight.T, no bias);
* ``pe`` (L, d), optional: the positional table added to the embeddings, a buffer holding
  tinyformer's sinusoids (PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...),
  ``F.sinusoid_table``); it is checked, never learned, and written on export (so that
  ``load_state_dict`` of the benchmarks' module is strict); a module that computes its
  sinusoids instead drops it (``strict=False``);
* ``transformer.`` followed by the keys of ``torch.nn.Transformer``'s own state dict:
  per encoder layer ``transformer.encoder.layers.{i}.`` + ``self_attn.in_proj_weight`` (3d, d),
  ``self_attn.in_proj_bias`` (3d,): Q, K and V packed in this order; ``self_attn.out_proj.weight``
  (d, d) and ``.bias``; ``linear1.weight`` (f, d), ``linear1.bias``, ``linear2.weight`` (d, f),
  ``linear2.bias``; ``norm1`` (after self-attention) and ``norm2`` (after the feed-forward network),
  each ``.weight`` and ``.bias`` (d,); per decoder layer ``transformer.decoder.layers.{i}.`` + the
  same with ``multihead_attn`` (attention over the encoder output) beside ``self_attn`` and
  ``norm1``, ``norm2``, ``norm3`` after self-attention, cross-attention and the feed-forward
  network; and ``transformer.encoder.norm`` and ``transformer.decoder.norm`` (``.weight``,
  ``.bias``) exactly when the model_config has final LayerNorms (``final_norm``, or pre-LN with
  final_norm unset). Stock ``nn.Transformer`` has them: its model_config says ``final_norm: true``.

The module computes (``build_torch_model``'s ``forward``): ``x = embed(ids) * sqrt(d)`` (without the
factor when ``scale_embedding`` is false) ``+ pe[:length]``, dropout; then ``nn.Transformer(d, heads,
encoder layers, decoder layers, d_ff, dropout, activation, layer_norm_eps=eps, batch_first=True,
norm_first=norm_first)`` on source and target with a causal target mask and the source's padding
(id ``pad_id``) masked for self- and cross-attention; ``relu``, ``gelu`` (exact) and ``silu``
(``F.silu``) are the activations. Sentences are tinyformer's: source ids then EOS, target input BOS
then ids, the ids of the run's sentencepiece model (pad 0, unk 1, bos 2, eos 3).

What this layout has no tensor for is refused, naming the model_config field: a separate target
vocabulary (``tgt_vocab_size``), positions other than the sinusoids (``positional``), a bias on the
logits (``logits_bias``). Every other field (depths, widths, ``norm_first``, ``final_norm``,
``activation``, ``scale_embedding``, ``eps``, dropout) travels in the model_config JSON beside the
weights. Conversions are NumPy only (torch is needed to read or write a ``.pt`` file, not here).
"""

import numpy

from ...engine import functional as F
from ...model.nn import TransformerConfig, limits
from .tensor_files import InteropError, float_array

__all__ = ["TorchStateError", "EMBEDDING", "POSITIONS", "torch_config", "torch_names", "to_torch_state",
           "from_torch_state", "check_declared"]

EMBEDDING = "embed.weight"
POSITIONS = "pe"
# The fields whose other values this layout holds no tensor for: (field, the one value it can hold, why).
_REPRESENTABLE = (("tgt_vocab_size", None, "one embedding serves source, target and output (embed.weight)"),
                  ("positional", "sinusoid", "the positions are tinyformer's sinusoids (pe), learned by no one"),
                  ("logits_bias", False, "the logits are h @ embed.weight.T, without a bias"))
_ATTENTION = (("self_attn", "self_attn"), ("multihead_attn", "cross_attn"))  # (PyTorch's name, ours)
_NORMS = {"encoder": ("attn_block", "ff_block"), "decoder": ("self_block", "cross_block", "ff_block")}


class TorchStateError(InteropError):
    """A PyTorch state dict that is not the layout of ``interop.torch_transformer``, or a model it cannot hold."""


def torch_config(config, where="the model_config"):
    """``config`` (a TransformerConfig or its ``to_dict()``) as a TransformerConfig, refused (naming the
    field) where the PyTorch layout cannot hold such a model."""
    if isinstance(config, dict):
        try:
            config = TransformerConfig.from_dict(config)
        except (TypeError, ValueError) as error:
            raise TorchStateError(f"{where}: {error}") from None
    for field, value, why in _REPRESENTABLE:
        if getattr(config, field) != value:
            raise TorchStateError(f"{where}: {field}={getattr(config, field)!r} cannot be a PyTorch nn.Transformer "
                                  f"state dict (only {field}={value!r}: {why})")
    return limits.check_buildable(config, where, TorchStateError)


def torch_names(config):
    """{PyTorch tensor name: (the tinyformer parameters it holds, concatenated on axis 0)} of every
    parameter of ``config``'s model, in the order of PyTorch's ``state_dict``."""
    config = torch_config(config)
    names = {EMBEDDING: ("src_embed.weight",)}
    for side, depth in zip(("encoder", "decoder"), config.depths):
        for i in range(depth):
            theirs, ours = f"transformer.{side}.layers.{i}.", f"{side}.layers.{i}."
            for torch_attention, attention in _ATTENTION[:1 if side == "encoder" else 2]:
                for kind in ("weight", "bias"):
                    names[f"{theirs}{torch_attention}.in_proj_{kind}"] = tuple(
                        f"{ours}{attention}.w_{part}.{kind}" for part in "qkv")
                for kind in ("weight", "bias"):
                    names[f"{theirs}{torch_attention}.out_proj.{kind}"] = (f"{ours}{attention}.w_o.{kind}",)
            for linear in ("linear1", "linear2"):
                for kind in ("weight", "bias"):
                    names[f"{theirs}{linear}.{kind}"] = (f"{ours}feed_forward.{linear}.{kind}",)
            for number, block in enumerate(_NORMS[side], 1):
                for kind in ("weight", "bias"):
                    names[f"{theirs}norm{number}.{kind}"] = (f"{ours}{block}.norm.{kind}",)
        if config.has_final_norm:
            for kind in ("weight", "bias"):
                names[f"transformer.{side}.norm.{kind}"] = (f"{side}.final_norm.{kind}",)
    return names


def to_torch_state(state, config):
    """The PyTorch state dict ({name: NumPy array}, the arrays' dtype kept) of a tinyformer state dict of
    ``config``'s model, ``pe`` (tinyformer's sinusoids) included."""
    config = torch_config(config)
    names = torch_names(config)
    expected = {ours for parts in names.values() for ours in parts}
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        problem = (f"parameter {missing[0]} is missing" if missing
                   else f"parameter {unexpected[0]} has no place in a PyTorch nn.Transformer state dict")
        raise TorchStateError(f"the state dict does not fit its model_config: {problem}")
    dtype = numpy.asarray(state["src_embed.weight"]).dtype
    # tinyformer's float32 table, as its model holds it (widened in a float64 model)
    tensors = {POSITIONS: F.sinusoid_table(config.max_len, config.d_model).astype(dtype)}
    for theirs, parts in names.items():
        arrays = [numpy.asarray(state[ours]) for ours in parts]
        tensors[theirs] = numpy.ascontiguousarray(numpy.concatenate(arrays) if len(arrays) > 1 else arrays[0])
    return tensors


def from_torch_state(tensors, config, where):
    """tinyformer's state dict ({name: NumPy array}: float32 or float64 as stored, half precision widened)
    of a PyTorch state dict ``tensors`` ({name: torch tensor or array}) of ``config``'s model. Every
    tensor of the layout present, none other, each of its shape and finite, ``pe`` (when present)
    tinyformer's sinusoids; otherwise a one-line TorchStateError starting with ``where`` names the
    first tensor that is missing, unexpected or misshapen."""
    config = torch_config(config, f"{where}: the model_config")
    names = torch_names(config)
    missing = [name for name in names if name not in tensors]
    unexpected = sorted(set(tensors) - set(names) - {POSITIONS})
    if missing:
        raise TorchStateError(f"{where}: tensor {missing[0]} is missing{_final_norm_hint(missing[0], config)}"
                              + (f" (and {unexpected[0]} is not part of the layout)" if unexpected else ""))
    if unexpected:
        raise TorchStateError(f"{where}: tensor {unexpected[0]} is not part of a PyTorch nn.Transformer of this "
                              f"model_config{_final_norm_hint(unexpected[0], config)}"
                              + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    state = {}
    dims = limits.parameter_dims(config)
    for theirs, parts in names.items():
        value = float_array(tensors[theirs], f"{where}: tensor {theirs}", TorchStateError)
        limits.check_tensor(theirs, value.shape, value.dtype.name, dims[parts[0]], config, where, TorchStateError,
                            times=len(parts))
        if not numpy.isfinite(value).all():
            raise TorchStateError(f"{where}: tensor {theirs} holds NaN or Inf")
        for ours, part in zip(parts, numpy.split(value, len(parts)) if len(parts) > 1 else [value]):
            state[ours] = numpy.ascontiguousarray(part)
    if POSITIONS in tensors:
        _check_positions(float_array(tensors[POSITIONS], f"{where}: tensor {POSITIONS}", TorchStateError),
                         config, where)
    return state


def check_declared(declared, config, where, origin=None):
    """The dtype and shape of each tensor of the layout a file declares ({name: (shape, dtype name)}, before
    its data is read) against ``config`` (from the file ``origin``); the missing and the unknown are
    ``from_torch_state``'s to name."""
    names, dims = torch_names(config), limits.parameter_dims(config)
    for name, (shape, dtype) in declared.items():
        wanted = (("max_len", "d_model"), 1) if name == POSITIONS else (
            (dims[names[name][0]], len(names[name])) if name in names else None)
        if wanted is not None:
            limits.check_tensor(name, shape, dtype, wanted[0], config, where, TorchStateError,
                                dtypes=limits.FLOAT_DTYPES + ("bfloat16",), times=wanted[1], origin=origin)


def _check_positions(stored, config, where):
    table = F.sinusoid_table(config.max_len, config.d_model)
    if stored.shape != table.shape:
        raise TorchStateError(f"{where}: tensor {POSITIONS} has shape {stored.shape}, but the model_config's max_len "
                              f"and d_model make it {table.shape}")
    if not numpy.allclose(stored, table, atol=1e-4, rtol=0):
        raise TorchStateError(f"{where}: tensor {POSITIONS} is not tinyformer's sinusoids (learned or other "
                              "positions are not supported: positional='sinusoid' only)")


def _final_norm_hint(name, config):
    """Why a final LayerNorm's tensor is missing or unexpected: the model_config's final_norm."""
    if name.startswith(("transformer.encoder.norm.", "transformer.decoder.norm.")):
        return (f" (the model_config has final LayerNorms: final_norm={config.final_norm!r}, "
                f"norm_first={config.norm_first!r})" if config.has_final_norm else
                " (the model_config has no final LayerNorms: stock nn.Transformer has them, final_norm: true)")
    return ""
