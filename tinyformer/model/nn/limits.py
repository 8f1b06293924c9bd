"""What a model read from a file may be: the stated bounds on its shape, and the one check of a
``TransformerConfig`` against them and against the tensors a file holds, before anything is built.

Every door a model comes in by (a checkpoint, a safetensors checkpoint, a Marian folder, a PyTorch
state dict, ``train --init-from``) calls ``check_buildable`` on the config the file states, then
``check_tensors`` (or ``check_tensor``, under the file's own names) on the tensors' shapes and dtypes
as the file's header declares them, and only then reads the data or builds the model. Sizes are
Python ints, so nothing overflows; the parameter count is arithmetic (``parameter_count``), so an
absurd depth or width is refused without a dict, an array or a layer of that size. The bounds:

* ``MAX_LAYERS`` layers in each stack (the encoder's and the decoder's depth);
* ``MAX_POSITIONS`` positions (``max_len``), and ``MAX_POSITION_VALUES`` values in the positional
  table (``max_len * d_model``), which is computed, not read, for the sinusoids;
* ``MAX_PARAMETERS`` parameters in all (the paper's big model has 213 million).

A refusal is one line starting with ``where`` (the file), naming the field (in the file's own words
where ``labels`` gives them) and the bound, raised as ``error`` (each door's own error class).
"""

__all__ = ["MAX_LAYERS", "MAX_POSITIONS", "MAX_POSITION_VALUES", "MAX_PARAMETERS", "FLOAT_DTYPES",
           "parameter_count", "parameter_dims", "parameter_shapes", "check_buildable", "check_tensor",
           "check_tensors"]

MAX_LAYERS = 1024
MAX_POSITIONS = 65_536
MAX_POSITION_VALUES = 2**25  # 128 MiB in float32: 65,536 positions of 512, or 32,768 of 1,024
MAX_PARAMETERS = 2**31  # 8 GiB in float32
FLOAT_DTYPES = ("float16", "float32", "float64")  # what a tinyformer weight may be stored as


def _label(field, labels):
    return (labels or {}).get(field, field)


def _vocabularies(config):
    """(the source vocabulary, the target vocabulary's field: the one the output projection has)."""
    return config.src_vocab_size, ("tgt_vocab_size" if config.tgt_vocab_size is not None else "src_vocab_size")


def parameter_count(config):
    """The number of parameters ``Transformer(config)`` would have, by arithmetic alone."""
    d, f = config.d_model, config.d_ff
    encoder, decoder = config.depths
    attention = 4 * (d * d + d)
    feed_forward = 2 * d * f + f + d
    count = config.src_vocab_size * d + (config.tgt_vocab_size * d if config.tgt_vocab_size is not None else 0)
    count += encoder * (attention + feed_forward + 2 * 2 * d) + decoder * (2 * attention + feed_forward + 3 * 2 * d)
    count += 2 * 2 * d if config.has_final_norm else 0
    count += config.max_len * d if config.positional == "learned" else 0
    count += getattr(config, _vocabularies(config)[1]) if config.logits_bias else 0
    return count


def check_buildable(config, where, error=ValueError, labels=None):
    """``config`` (a TransformerConfig) if a model of it may be built: its vocabulary set, each stack at
    most MAX_LAYERS deep, max_len at most MAX_POSITIONS, the positional table and the parameters
    within their bounds; otherwise ``error`` ("{where}: ..."), naming the field (``labels``: the file's
    name for each of ours) and the bound. Arithmetic only: nothing of the model's size is made."""
    def refuse(problem):
        raise error(f"{where}: {problem}")

    if config.src_vocab_size is None:
        refuse(f"{_label('src_vocab_size', labels)} is unset")
    for field, depth in zip(("encoder_layers", "decoder_layers"), config.depths):
        if depth > MAX_LAYERS:
            field = field if getattr(config, field) is not None else "num_layers"
            refuse(f"{_label(field, labels)}={depth} layers is more than tinyformer builds (at most {MAX_LAYERS:,})")
    if config.max_len > MAX_POSITIONS:
        refuse(f"{_label('max_len', labels)}={config.max_len} positions is more than tinyformer builds "
               f"(at most {MAX_POSITIONS:,})")
    table = config.max_len * config.d_model
    if table > MAX_POSITION_VALUES:
        refuse(f"{_label('max_len', labels)}={config.max_len} positions of {_label('d_model', labels)}="
               f"{config.d_model} make a positional table of {table:,} values (at most {MAX_POSITION_VALUES:,})")
    count = parameter_count(config)
    if count > MAX_PARAMETERS:
        encoder, decoder = config.depths
        fields = [("d_model", config.d_model), ("d_ff", config.d_ff), ("src_vocab_size", config.src_vocab_size),
                  ("tgt_vocab_size", config.tgt_vocab_size),
                  ("encoder_layers" if config.encoder_layers is not None else "num_layers", encoder),
                  ("decoder_layers" if config.decoder_layers is not None else "num_layers", decoder)]
        shown = ", ".join(dict.fromkeys(f"{_label(name, labels)}={value}" for name, value in fields
                                        if value is not None))
        refuse(f"{shown} make a model of {count:,} parameters, more than tinyformer builds "
               f"(at most {MAX_PARAMETERS:,})")
    return config


def parameter_dims(config):
    """{parameter name: its shape as config field names}, in the order of the model's ``state_dict``
    (call ``check_buildable`` first: this lists every layer)."""
    d = "d_model"
    _, output = _vocabularies(config)
    dims = {}
    if config.logits_bias:
        dims["logits_bias"] = (output,)
    dims["src_embed.weight"] = ("src_vocab_size", d)
    if config.tgt_vocab_size is not None:
        dims["tgt_embed.weight"] = ("tgt_vocab_size", d)
    if config.positional == "learned":
        dims["positional.weight"] = ("max_len", d)
    blocks = {"encoder": (("self_attn",), ("attn_block", "ff_block")),
              "decoder": (("self_attn", "cross_attn"), ("self_block", "cross_block", "ff_block"))}
    for side, depth in zip(("encoder", "decoder"), config.depths):
        attentions, norms = blocks[side]
        for i in range(depth):
            layer = f"{side}.layers.{i}."
            for attention in attentions:
                for w in ("w_q", "w_k", "w_v", "w_o"):
                    dims[f"{layer}{attention}.{w}.weight"], dims[f"{layer}{attention}.{w}.bias"] = (d, d), (d,)
            ff = f"{layer}feed_forward."
            dims[f"{ff}linear1.weight"], dims[f"{ff}linear1.bias"] = ("d_ff", d), ("d_ff",)
            dims[f"{ff}linear2.weight"], dims[f"{ff}linear2.bias"] = (d, "d_ff"), (d,)
            for norm in norms:
                dims[f"{layer}{norm}.norm.weight"], dims[f"{layer}{norm}.norm.bias"] = (d,), (d,)
        if config.has_final_norm:
            dims[f"{side}.final_norm.weight"], dims[f"{side}.final_norm.bias"] = (d,), (d,)
    return dims


def parameter_shapes(config):
    """{parameter name: shape} of ``Transformer(config)``, without building it."""
    return {name: tuple(getattr(config, field) for field in dims) for name, dims in parameter_dims(config).items()}


def check_tensor(shown, shape, dtype, dims, config, where, error=ValueError, labels=None, source="the model_config",
                 dtypes=FLOAT_DTYPES, times=1, origin=None):
    """Tensor ``shown`` as a file declares it (``shape``, ``dtype`` name) against the ``dims`` (field names)
    ``config`` gives it, its first axis ``times`` as long (PyTorch's packed Q, K, V); ``error`` names the
    file (``where``), the tensor and, for a shape, the fields of ``source`` (the file ``origin``) that
    make it."""
    if str(dtype) not in dtypes:
        raise error(f"{where}: tensor {shown} has dtype {dtype}, where floating-point weights belong "
                    f"({', '.join(dtypes)})")
    wanted = tuple(getattr(config, field) for field in dims)
    wanted = (wanted[0] * times,) + wanted[1:] if wanted else wanted
    if tuple(shape) != wanted:
        fields = ", ".join(_label(field, labels) for field in dims)
        fields = f"{times} x {fields}" if times > 1 else fields
        raise error(f"{where}: tensor {shown} has shape {tuple(shape)}, but {source} makes it {wanted} "
                    f"({fields}{f' of {origin}' if origin else ''})")


def check_tensors(config, found, context, error=ValueError, dtypes=FLOAT_DTYPES):
    """The parameters a file declares (``found``: {name: (shape, dtype name)}) against ``config``'s model,
    before any is read: each of a floating-point dtype (else "{context}: tensor NAME has dtype ..."), none
    missing, none unexpected, each of its shape; otherwise ``error``, "{context}: " and the first of each
    kind of disagreement ("NAME is (2, 3), not (2, 4) (and 5 more like it)")."""
    for name, (_, dtype) in found.items():
        if str(dtype) not in dtypes:
            raise error(f"{context}: tensor {name} has dtype {dtype}, where floating-point weights belong "
                        f"({', '.join(dtypes)})")
    wanted = parameter_shapes(config)
    shapes = [f"{name} is {tuple(found[name][0])}, not {shape}" for name, shape in wanted.items()
              if name in found and tuple(found[name][0]) != shape]
    missing = [f"{name} is missing" for name in wanted if name not in found]
    unexpected = [f"{name} is not a parameter of the model" for name in sorted(set(found) - set(wanted))]
    parts = [group[0] + (f" (and {len(group) - 1} more like it)" if len(group) > 1 else "")
             for group in (shapes, missing, unexpected) if group]
    if parts:
        raise error(f"{context}: {'; '.join(parts)}")
