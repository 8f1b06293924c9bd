"""Marian models in and out: a Hugging Face ``opus-mt-*`` folder as a tinyformer run, and back.

A Marian folder (as transformers' ``MarianMTModel.save_pretrained`` and ``MarianTokenizer`` write it,
and as ``Helsinki-NLP/opus-mt-*`` is laid out on the Hub) holds ``config.json``, the weights
(``model.safetensors``, or ``pytorch_model.bin``), ``source.spm``, ``target.spm`` and ``vocab.json``
(``tokenizer_config.json`` and ``generation_config.json`` beside them are read when present).

Its model is the paper's post-LN Transformer with Marian's choices, which ``TransformerConfig``
names: the activation (``swish`` is SiLU), encoder and decoder depths, embeddings scaled or not,
the sinusoids in Marian's layout (``positional="sinusoid_split"``), a bias on the logits
(``final_logits_bias``) and one embedding matrix for source, target and output. The decoder starts
from the padding id, which ``MarianTokenizer.bos_id`` is. What tinyformer cannot build (another
``model_type``, pre-LN variants, separate vocabularies, learned positions, heads or feed-forward
widths that differ between encoder and decoder, layer drop) is refused, naming the field.

``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``, which runs no code from the
file (a pickle of anything but tensors is refused); without torch, ask for safetensors.
"""

from pathlib import Path

import numpy

from ...engine import functional as F
from ...model.nn import TransformerConfig, limits
from .tensor_files import InteropError, float_array, read_json, read_safetensors, read_torch_pickle, torch_declared

__all__ = ["MarianError", "MARIAN_WEIGHTS", "marian_config", "config_to_marian", "marian_names",
           "state_from_marian", "state_to_marian", "read_marian_folder"]

MARIAN_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu", "gelu": "gelu"}  # Marian's name -> ours
_REQUIRED = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
             "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
             "activation_function", "pad_token_id", "eos_token_id", "decoder_start_token_id")
# Fields MarianConfig gives a default, and those defaults (transformers' MarianConfig).
_DEFAULTS = {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0, "scale_embedding": False,
             "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True, "encoder_layerdrop": 0.0,
             "decoder_layerdrop": 0.0}
# Settings of older (BART-era) Marian configs that transformers' MarianMTModel does not build; a value other
# than this one is a model neither transformers nor tinyformer computes.
_UNSUPPORTED = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
                "static_position_embeddings": True, "add_bias_logits": False, "is_decoder": False}
_EMBEDDINGS = ("model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
               "lm_head.weight")
_POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")
_ATTENTION = {"q_proj": "w_q", "k_proj": "w_k", "v_proj": "w_v", "out_proj": "w_o"}
# config.json's name of each TransformerConfig field it gives (what a refusal names)
LABELS = {"src_vocab_size": "vocab_size", "d_ff": "encoder_ffn_dim=decoder_ffn_dim", "num_layers": "encoder_layers",
          "heads": "encoder_attention_heads=decoder_attention_heads", "max_len": "max_position_embeddings",
          "pad_id": "pad_token_id"}
_DTYPES = limits.FLOAT_DTYPES + ("bfloat16",)  # what float_array reads


class MarianError(InteropError):
    """A Marian folder tinyformer cannot read or build, or a model it cannot write as one."""


def marian_config(values, where="config.json"):
    """The ``TransformerConfig`` of a Marian ``config.json`` (a dict); a MarianError naming the field it
    cannot represent."""
    if not isinstance(values, dict):
        raise MarianError(f"{where} must hold a JSON object, got {type(values).__name__}")
    if values.get("model_type") != "marian":
        raise MarianError(f"{where}: model_type is {values.get('model_type')!r}, not 'marian' (only Marian "
                          "models, MarianMTModel, can be imported)")
    missing = [name for name in _REQUIRED if name not in values]
    if missing:
        raise MarianError(f"{where} lacks {', '.join(missing)}")
    c = {**_DEFAULTS, **values}
    for name, supported in _UNSUPPORTED.items():
        if c.get(name, supported) != supported:
            raise MarianError(f"{where}: {name}={c[name]!r} is a Marian variant transformers' MarianMTModel does not "
                              f"build, nor does tinyformer (only {name}={supported!r})")
    for encoder, decoder in (("encoder_attention_heads", "decoder_attention_heads"),
                             ("encoder_ffn_dim", "decoder_ffn_dim")):
        if c[encoder] != c[decoder]:
            raise MarianError(f"{where}: {encoder}={c[encoder]} and {decoder}={c[decoder]} differ; tinyformer's "
                              "encoder and decoder layers have one width and one number of heads")
    if not c["share_encoder_decoder_embeddings"] or c.get("decoder_vocab_size") not in (None, c["vocab_size"]):
        raise MarianError(f"{where}: share_encoder_decoder_embeddings={c['share_encoder_decoder_embeddings']!r}, "
                          f"decoder_vocab_size={c.get('decoder_vocab_size')!r}: separate source and target "
                          "vocabularies are not supported (only one shared vocabulary)")
    if not c["tie_word_embeddings"]:
        raise MarianError(f"{where}: tie_word_embeddings=False: an output projection of its own is not supported "
                          "(the output projection is the embedding matrix)")
    for name in ("encoder_layerdrop", "decoder_layerdrop"):
        if c[name]:
            raise MarianError(f"{where}: {name}={c[name]!r}: layer drop is not supported (only 0)")
    if not isinstance(c["activation_function"], str) or c["activation_function"] not in _ACTIVATIONS:
        raise MarianError(f"{where}: activation_function={c['activation_function']!r} is not one of "
                          f"{', '.join(sorted(_ACTIVATIONS))}")
    if not isinstance(c["eos_token_id"], int):
        raise MarianError(f"{where}: eos_token_id={c['eos_token_id']!r}: only one EOS id is supported")
    if c["decoder_start_token_id"] != c["pad_token_id"]:
        raise MarianError(f"{where}: decoder_start_token_id={c['decoder_start_token_id']!r} is not pad_token_id="
                          f"{c['pad_token_id']!r}; a Marian decoder starts from the padding id")
    try:
        config = TransformerConfig(
            src_vocab_size=c["vocab_size"], d_model=c["d_model"], d_ff=c["encoder_ffn_dim"],
            heads=c["encoder_attention_heads"], num_layers=c["encoder_layers"], encoder_layers=c["encoder_layers"],
            decoder_layers=c["decoder_layers"], dropout=c["dropout"], attention_dropout=c["attention_dropout"],
            activation_dropout=c["activation_dropout"], max_len=c["max_position_embeddings"],
            pad_id=c["pad_token_id"], eps=1e-5, positional="sinusoid_split", final_norm=False,
            activation=_ACTIVATIONS[c["activation_function"]], scale_embedding=c["scale_embedding"],
            logits_bias=True)
    except (TypeError, ValueError) as error:
        raise MarianError(f"{where}: {error}") from None
    return limits.check_buildable(config, where, MarianError, LABELS)


def config_to_marian(config, eos_id, base=None):
    """A Marian ``config.json`` (dict) for a ``TransformerConfig`` that is a Marian model; ``base``: the
    imported folder's own config.json, whose other fields (init_std, architectures, ...) are kept.
    A MarianError names the first setting Marian does not have."""
    c = config if isinstance(config, TransformerConfig) else TransformerConfig.from_dict(config)
    wanted = {"positional": "sinusoid_split", "norm_first": False, "tgt_vocab_size": None, "eps": 1e-5}
    for name, value in wanted.items():
        if getattr(c, name) != value:
            raise MarianError(f"the model's {name} is {getattr(c, name)!r}; a Marian model has {name}={value!r}")
    if c.has_final_norm:
        raise MarianError("the model ends each stack in a LayerNorm (final_norm); a Marian model does not")
    encoder_layers, decoder_layers = c.depths
    activation = {"relu": "relu", "silu": "swish", "gelu": "gelu"}[c.activation]
    values = dict(base or {})
    values.update({
        "model_type": "marian", "architectures": ["MarianMTModel"], "vocab_size": c.src_vocab_size,
        "decoder_vocab_size": c.src_vocab_size, "d_model": c.d_model, "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers, "encoder_attention_heads": c.heads, "decoder_attention_heads": c.heads,
        "encoder_ffn_dim": c.d_ff, "decoder_ffn_dim": c.d_ff, "max_position_embeddings": c.max_len,
        "activation_function": activation, "dropout": c.dropout, "attention_dropout": c.attention_dropout,
        "activation_dropout": c.activation_dropout, "scale_embedding": c.scale_embedding,
        "pad_token_id": c.pad_id, "decoder_start_token_id": c.pad_id, "eos_token_id": eos_id,
        "forced_eos_token_id": eos_id, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
        "is_encoder_decoder": True, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
    })
    values.setdefault("init_std", 0.02)
    return values


def marian_names(config):
    """{Marian tensor name: tinyformer parameter name} of every stack parameter of ``config``'s model."""
    encoder_layers, decoder_layers = config.depths
    names = {}
    for side, count, blocks in (("encoder", encoder_layers, (("self_attn", "self_attn", "attn_block"),)),
                                ("decoder", decoder_layers, (("self_attn", "self_attn", "self_block"),
                                                             ("encoder_attn", "cross_attn", "cross_block")))):
        for i in range(count):
            theirs, ours = f"model.{side}.layers.{i}.", f"{side}.layers.{i}."
            for marian, attention, block in blocks:
                for projection, w in _ATTENTION.items():
                    for kind in ("weight", "bias"):
                        names[f"{theirs}{marian}.{projection}.{kind}"] = f"{ours}{attention}.{w}.{kind}"
                for kind in ("weight", "bias"):
                    names[f"{theirs}{marian}_layer_norm.{kind}"] = f"{ours}{block}.norm.{kind}"
            for kind in ("weight", "bias"):
                names[f"{theirs}fc1.{kind}"] = f"{ours}feed_forward.linear1.{kind}"
                names[f"{theirs}fc2.{kind}"] = f"{ours}feed_forward.linear2.{kind}"
                names[f"{theirs}final_layer_norm.{kind}"] = f"{ours}ff_block.norm.{kind}"
    return names


def state_from_marian(tensors, config, where):
    """tinyformer's state dict of Marian ``tensors`` ({name: array}) for ``config``: every stack tensor
    present with its shape, one embedding matrix (its tied copies equal), the positions (when stored)
    Marian's sinusoids. A MarianError names the first tensor that is missing, unexpected or misshapen."""
    expected = limits.parameter_shapes(config)
    names = marian_names(config)
    state = {}
    embeddings = [name for name in _EMBEDDINGS if name in tensors]
    if not embeddings:
        raise MarianError(f"{where}: no embedding matrix (none of {', '.join(_EMBEDDINGS)})")
    first = _array(tensors[embeddings[0]], f"{where}: tensor {embeddings[0]}")
    for name in embeddings[1:]:
        other = _array(tensors[name], f"{where}: tensor {name}")
        if other.shape != first.shape or not numpy.array_equal(other, first):
            raise MarianError(f"{where}: {name} differs from {embeddings[0]}: untied embeddings are not supported")
    state["src_embed.weight"] = first
    bias = (_array(tensors["final_logits_bias"], f"{where}: tensor final_logits_bias")
            if "final_logits_bias" in tensors else None)
    state["logits_bias"] = (numpy.zeros(config.src_vocab_size, numpy.float32) if bias is None
                            else bias.reshape(-1) if bias.ndim == 2 and bias.shape[0] == 1 else bias)
    table = (F.sinusoid_table(config.max_len, config.d_model, layout="split")
             if any(name in tensors for name in _POSITIONS) else None)
    for name in _POSITIONS:
        if name in tensors:
            stored = _array(tensors[name], f"{where}: tensor {name}")
            if stored.shape != table.shape or not numpy.allclose(stored, table, atol=1e-4):
                raise MarianError(f"{where}: {name} {stored.shape} is not Marian's sinusoids of "
                                  f"{tuple(table.shape)}: learned positions are not supported")
    for marian, ours in names.items():
        if marian not in tensors:
            raise MarianError(f"{where}: tensor {marian} is missing")
        state[ours] = _array(tensors[marian], f"{where}: tensor {marian}")
    known = set(names) | set(_EMBEDDINGS) | set(_POSITIONS) | {"final_logits_bias"}
    unexpected = sorted(set(tensors) - known)
    if unexpected:
        raise MarianError(f"{where}: tensor {unexpected[0]} is not part of a MarianMTModel of this config.json"
                          + (f" (and {len(unexpected) - 1} more)" if len(unexpected) > 1 else ""))
    for name, value in state.items():
        if value.shape != expected[name]:
            marian = next((m for m, o in names.items() if o == name), name)
            raise MarianError(f"{where}: tensor {marian} has shape {value.shape}, but config.json makes it "
                              f"{expected[name]}")
        if not numpy.isfinite(value).all():
            raise MarianError(f"{where}: tensor {name} holds NaN or Inf")
    return state


def state_to_marian(state, config):
    """Marian tensors ({name: float32 array}) of a tinyformer state dict of ``config``'s model."""
    tensors = {marian: numpy.ascontiguousarray(state[ours], dtype=numpy.float32)
               for marian, ours in marian_names(config).items()}
    tensors["model.shared.weight"] = numpy.ascontiguousarray(state["src_embed.weight"], dtype=numpy.float32)
    bias = state.get("logits_bias")
    tensors["final_logits_bias"] = (numpy.zeros((1, config.src_vocab_size), numpy.float32) if bias is None
                                    else numpy.asarray(bias, numpy.float32).reshape(1, -1))
    return tensors


def _array(value, name):
    """A float32 NumPy array of a tensor read from safetensors or torch (bf16 and fp16 widened)."""
    return float_array(value, name, MarianError).astype(numpy.float32, copy=False)


def check_declared(declared, config, where):
    """The dtype and shape of each tensor of ``config``'s Marian model a file declares ({name: (shape, dtype
    name)}, before its data is read); the missing and the unknown are ``state_from_marian``'s to name."""
    ours = limits.parameter_dims(config)
    dims = {marian: ours[name] for marian, name in marian_names(config).items()}
    dims.update({name: ("src_vocab_size", "d_model") for name in _EMBEDDINGS})
    dims["final_logits_bias"] = ("src_vocab_size",)
    for name, (shape, dtype) in declared.items():
        if name in _POSITIONS:  # compared with Marian's sinusoids once read
            if dtype not in _DTYPES:
                raise MarianError(f"{where}: tensor {name} has dtype {dtype}, where floating-point weights belong")
            continue
        if name in dims:
            if name == "final_logits_bias" and len(shape) == 2 and shape[0] == 1:
                shape = shape[1:]
            limits.check_tensor(name, shape, dtype, dims[name], config, where, MarianError, LABELS,
                                source="config.json", dtypes=_DTYPES)


def _read_tensors(folder, config):
    """({name: array}, the file) of a folder's weights: model.safetensors, else pytorch_model.bin; each
    tensor's shape and dtype checked against ``config`` (safetensors: before its data is read)."""
    safetensors_path, bin_path = (folder / name for name in MARIAN_WEIGHTS)
    if safetensors_path.exists():
        return read_safetensors(safetensors_path, MarianError,
                                lambda _, declared: check_declared(declared, config, str(safetensors_path))), \
            safetensors_path
    if not bin_path.exists():
        raise MarianError(f"{folder} holds no weights ({' or '.join(MARIAN_WEIGHTS)})")
    tensors = read_torch_pickle(bin_path, MarianError, "give the folder a model.safetensors")
    check_declared(torch_declared(tensors), config, str(bin_path))
    return tensors, bin_path


def read_marian_folder(folder):
    """(TransformerConfig, tinyformer state dict, MarianTokenizer, extras) of a Marian folder, every file
    checked; ``extras`` holds its config.json and generation_config.json (for ``export --format marian``).
    A MarianError (or the tokenizer's TokenizerFilesError) names what is wrong; nothing is written."""
    from ..data.marian_tokenizer import MarianTokenizer, MARIAN_FILES

    folder = Path(folder)
    if not folder.is_dir():
        raise MarianError(f"{folder} is not a folder" if folder.exists() else f"{folder} does not exist")
    missing = [name for name in ("config.json",) + MARIAN_FILES if not (folder / name).exists()]
    if missing:
        raise MarianError(f"{folder} lacks {', '.join(missing)} (a Marian model folder holds config.json, "
                          f"{' or '.join(MARIAN_WEIGHTS)}, {', '.join(MARIAN_FILES)})")
    values = read_json(folder / "config.json", MarianError)
    config = marian_config(values, str(folder / "config.json"))
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.exists():
        settings = read_json(tokenizer_config, MarianError)
        if isinstance(settings, dict) and settings.get("separate_vocabs"):
            raise MarianError(f"{tokenizer_config}: separate_vocabs=true: separate source and target "
                              "vocabularies are not supported")
    tokenizer = MarianTokenizer(folder)
    for name, ours, theirs in (("vocab_size", len(tokenizer), values["vocab_size"]),
                               ("pad_token_id", tokenizer.pad_id, values["pad_token_id"]),
                               ("eos_token_id", tokenizer.eos_id, values["eos_token_id"])):
        if ours != theirs:
            raise MarianError(f"{folder}: config.json's {name} is {theirs}, but vocab.json makes it {ours}")
    tensors, weights = _read_tensors(folder, config)
    state = state_from_marian(tensors, config, str(weights))
    generation = folder / "generation_config.json"
    settings = read_json(generation, MarianError) if generation.exists() else None
    if settings is not None and not isinstance(settings, dict):
        raise MarianError(f"{generation} must hold a JSON object, got {type(settings).__name__}")
    extras = {"config": values, "generation_config": settings}
    return config, state, tokenizer, extras

