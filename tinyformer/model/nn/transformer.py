"""Encoder and decoder stacks and the full Transformer (§3.1, §3.4, §3.5)."""

import math

import numpy

from ...engine import functional as F
from ...engine.random import make_generator
from . import init
from .init import zeros
from .attention import MultiHeadAttention
from .config import LABEL_SMOOTHING_MOVED, TransformerConfig
from .layers import (Dropout, Embedding, LayerNorm, PositionalEncoding, PositionwiseFeedForward, positional_encoding,
                     scale_embedding)
from .module import Module, ModuleList, Parameter
from .output_bias import call_leaving_output_bias
from .packing import PackedRows
from .presets import preset_config

__all__ = ["EncoderLayer", "DecoderLayer", "Encoder", "Decoder", "Transformer", "DecoderState"]


class _Residual(Module):
    """One sub-layer connection: LayerNorm(x + Dropout(f(x))) (post-LN, §5.4) or
    x + Dropout(f(LayerNorm(x))) (pre-LN). Post-LN, the sublayer's ``module`` may leave its output
    bias for this connection's one node to add (``output_bias``), where it says it did."""

    def __init__(self, d_model, dropout, norm_first, eps):
        super().__init__()
        self.norm = LayerNorm(d_model, eps)
        self.dropout = Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x, sublayer, module=None):
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        # = self.norm(x + self.dropout(sublayer(x))), one node (one kernel on the GPU) that also adds the
        # bias of the sublayer's last linear layer where the sublayer left it out
        y, y_bias = call_leaving_output_bias(module, sublayer, x)
        return F.residual_dropout_layer_norm(x, y, self.norm.weight, self.norm.bias, self.dropout.p,
                                             self.training, self.dropout.generator, self.norm.eps, y_bias=y_bias)


class EncoderLayer(Module):
    """Self-attention then the position-wise feed-forward network, each in a residual block."""

    def __init__(self, d_model, heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 activation_dropout=0.0, norm_first=False, eps=1e-5, generator=None, activation="relu"):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout, generator)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation_dropout, generator, activation)
        self.attn_block = _Residual(d_model, dropout, norm_first, eps)
        self.ff_block = _Residual(d_model, dropout, norm_first, eps)

    def forward(self, x, mask=None, rows=None):
        """``rows`` (a ``PackedRows``): x is the packed rows (count, d_model) of those positions."""
        x = self.attn_block(x, lambda h: self.self_attn(h, mask=mask, query_rows=rows), self.self_attn)
        return self.ff_block(x, self.feed_forward, self.feed_forward)


class DecoderLayer(Module):
    """Masked self-attention, attention over the encoder output, then the feed-forward network."""

    def __init__(self, d_model, heads, d_ff, dropout=0.1, attention_dropout=0.0,
                 activation_dropout=0.0, norm_first=False, eps=1e-5, generator=None, activation="relu"):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads, attention_dropout, generator)
        self.cross_attn = MultiHeadAttention(d_model, heads, attention_dropout, generator)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, activation_dropout, generator, activation)
        self.self_block = _Residual(d_model, dropout, norm_first, eps)
        self.cross_block = _Residual(d_model, dropout, norm_first, eps)
        self.ff_block = _Residual(d_model, dropout, norm_first, eps)

    def forward(self, x, memory, memory_mask=None, tgt_mask=None, cache=None, rows=None, memory_rows=None):
        """``cache`` ({"self": {}, "cross": {}}) holds keys/values between decoding steps. ``rows`` and
        ``memory_rows`` (``PackedRows``): x and memory are the packed rows of those positions."""
        self_cache = cross_cache = None
        if cache is not None:
            self_cache, cross_cache = cache.setdefault("self", {}), cache.setdefault("cross", {})
        x = self.self_block(
            x, lambda h: self.self_attn(h, mask=tgt_mask, causal=True, cache=self_cache, query_rows=rows),
            self.self_attn)
        x = self.cross_block(
            x, lambda h: self.cross_attn(h, memory, memory, mask=memory_mask, cache=cross_cache,
                                         static_kv=True, query_rows=rows, key_rows=memory_rows),
            self.cross_attn)
        return self.ff_block(x, self.feed_forward, self.feed_forward)


class _Stack(Module):
    """N identical layers, plus a final LayerNorm when ``final_norm`` is True; None (the default):
    only when pre-LN, whose residual stream is unnormalised. PyTorch's nn.Transformer has one also
    when post-LN (``final_norm=True``)."""

    layer_class = None

    def __init__(self, num_layers, d_model, norm_first=False, eps=1e-5, final_norm=None, **layer_args):
        super().__init__()
        self.layers = ModuleList(
            self.layer_class(d_model, norm_first=norm_first, eps=eps, **layer_args)
            for _ in range(num_layers)
        )
        self.final_norm = LayerNorm(d_model, eps) if (norm_first if final_norm is None else final_norm) else None

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)


class Encoder(_Stack):
    """The encoder: N EncoderLayers."""

    layer_class = EncoderLayer

    def forward(self, x, mask=None, rows=None):
        for layer in self.layers:
            x = layer(x, mask, rows)
        return self._finish(x)


class Decoder(_Stack):
    """The decoder: N DecoderLayers; ``state`` carries their caches when decoding step by step."""

    layer_class = DecoderLayer

    def forward(self, x, memory, memory_mask=None, tgt_mask=None, state=None, rows=None, memory_rows=None):
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, memory_mask, tgt_mask, None if state is None else state.caches[i], rows, memory_rows)
        return self._finish(x)


class DecoderState:
    """What incremental decoding carries between steps: per-layer key/value caches and the position."""

    def __init__(self, num_layers):
        self.caches = [{} for _ in range(num_layers)]
        self.position = 0

    def reorder(self, index):
        """Keep batch rows ``index`` (an integer array) of every cache, e.g. surviving beams."""
        for cache in self.caches:
            for part in cache.values():
                for name in list(part):
                    part[name] = part[name][index]


class Transformer(Module):
    """The encoder-decoder Transformer of §3 with tied embeddings (§3.4).

    Token ids → embedding × √d_model + positional encoding → dropout → N encoder
    layers; the decoder does the same on the shifted target, attends to the
    encoder output, and its output is projected on the target embedding matrix
    to give logits. With one shared vocabulary (``tgt_vocab_size`` None) the
    source embedding, target embedding and pre-softmax projection are a single
    matrix; with two vocabularies the target embedding is the projection.
    ``positional`` is "sinusoid" (the fixed encodings of §3.5), "learned" (one
    learned vector per position, shared by encoder and decoder: Table 3 row (E)) or
    "sinusoid_split" (§3.5's sinusoids in Marian's layout).
    The whole shape is one ``TransformerConfig``: ``Transformer(config)`` builds it, and
    ``model.config`` is that config (a checkpoint stores its ``to_dict()`` as ``model_config``).
    ``Transformer(src_vocab_size=..., d_model=..., ...)`` is a convenience for
    ``Transformer(TransformerConfig(src_vocab_size=..., d_model=..., ...))``: the keywords are the
    config's fields, with the config's defaults.
    """

    def __init__(self, config=None, **fields):
        """``config``: a ``TransformerConfig`` with its vocabulary set; or, instead, its fields as
        keywords (an unknown one is a one-line TypeError naming it).

        ``seed`` gives the initialisation a generator of its own; dropout always draws
        from the default generator, which ``tinyformer.manual_seed`` resets.
        """
        super().__init__()
        c = self.config = _config_of(config, fields)
        generator = None if c.seed is None else make_generator(c.seed)
        self.d_model, self.pad_id = c.d_model, c.pad_id
        self.shared_vocab = c.tgt_vocab_size is None
        self.src_embed = Embedding(c.src_vocab_size, c.d_model, generator)
        self.tgt_embed = self.src_embed if self.shared_vocab else Embedding(c.tgt_vocab_size, c.d_model, generator)
        self.positional = None  # set below; assigned here to keep its place among the modules
        self.embed_dropout = Dropout(c.dropout)
        layer_args = dict(heads=c.heads, d_ff=c.d_ff, dropout=c.dropout, attention_dropout=c.attention_dropout,
                          activation_dropout=c.activation_dropout, generator=generator, activation=c.activation)
        encoder_layers, decoder_layers = c.depths
        self.encoder = Encoder(encoder_layers, c.d_model, c.norm_first, c.eps, c.final_norm, **layer_args)
        self.decoder = Decoder(decoder_layers, c.d_model, c.norm_first, c.eps, c.final_norm, **layer_args)
        # Learned positions are drawn after the stacks, so that with the same seed such a model
        # starts from the sinusoid model's weights everywhere else (a controlled Table 3 (E)).
        self.positional = positional_encoding(c.positional, c.d_model, c.max_len, generator)
        if c.init == "torch":  # redrawn last: with the same seed the embeddings equal the "xavier" model's
            _torch_init(self.encoder, self.decoder, generator=generator)
        self.scales_embeddings = c.scale_embedding
        # None unless asked for: a model without it has the parameters, in the order, it always had.
        self.logits_bias = Parameter(zeros(self.tgt_vocab_size)) if c.logits_bias else None  # (init: the argument)

    @classmethod
    def from_config(cls, config):
        """``Transformer(config)``, by name."""
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"Transformer.from_config: expected a TransformerConfig, got {type(config).__name__}"
                            + (" (a dict: use TransformerConfig.from_dict)" if isinstance(config, dict) else ""))
        return cls(config)

    @classmethod
    def from_preset(cls, name, vocab_size=None, *, paper=False, **overrides):
        """A model of a named size (``nn.PRESETS``), e.g. ``from_preset("base", vocab_size=37000)``;
        ``paper=True``: the paper's exact model of that size (``nn.PAPER_CHOICES``)."""
        return cls(preset_config(name, vocab_size, paper=paper, **overrides))

    @property
    def label_smoothing(self):
        raise AttributeError(f"Transformer has no label_smoothing: {LABEL_SMOOTHING_MOVED}")

    @property
    def src_vocab_size(self):
        return self.src_embed.vocab_size

    @property
    def tgt_vocab_size(self):
        return self.tgt_embed.vocab_size

    def _embed(self, embedding, ids, offset=0):
        if isinstance(self.positional, PositionalEncoding) and type(embedding) is Embedding:
            # the fixed sinusoids: lookup, scale, positions and dropout as one op (one launch each way)
            dropout, weight = self.embed_dropout, embedding.weight
            return F.embedding_input(ids, weight, math.sqrt(self.d_model) if self.scales_embeddings else 1.0,
                                     self.positional.rows(ids.shape[-1], offset, weight.dtype), dropout.p,
                                     dropout.training, dropout.generator)
        x = embedding(ids)
        if self.scales_embeddings:
            x = scale_embedding(x, self.d_model)
        return self.embed_dropout(self.positional(x, offset))

    def source_mask(self, src):
        """Keep-mask (batch, 1, 1, len_src) hiding source padding."""
        return F.padding_mask(src, self.pad_id)

    def encode(self, src, src_mask=None):
        """Source ids (batch, len_src) -> memory (batch, len_src, d_model)."""
        _check_ids_2d(src, "src")
        if src_mask is None:
            src_mask = self.source_mask(src)
        return self.encoder(self._embed(self.src_embed, src), src_mask)

    def decode(self, tgt, memory, src_mask=None, tgt_mask=None, state=None, positions=None):
        """Target ids (batch, len_tgt) and memory -> logits (batch, len_tgt, tgt_vocab).

        Self-attention is causal. With ``state`` (from ``init_state``) ``tgt`` holds
        only the new tokens: earlier keys and values come from the cache. ``positions``, a
        boolean (batch, len_tgt) array, asks for the logits of those positions only, as
        (count, tgt_vocab) in row-major order: the output projection and what follows it (the
        loss's softmax over the vocabulary) skip the others, e.g. the padding.
        """
        _check_ids_2d(tgt, "tgt")
        _check_positions(positions, tgt)
        if memory.ndim != 3 or memory.shape[0] != tgt.shape[0] or memory.shape[-1] != self.d_model:
            raise ValueError(f"Transformer.decode: memory must be (batch, len_src, d_model) = "
                             f"({tgt.shape[0]}, len_src, {self.d_model}) for tgt of shape {tuple(tgt.shape)}, "
                             f"got shape {memory.shape}")
        offset = 0 if state is None else state.position
        x = self._embed(self.tgt_embed, tgt, offset)
        h = self.decoder(x, memory, src_mask, tgt_mask, state)
        if state is not None:
            state.position += tgt.shape[1]
        if positions is not None:
            h = h[positions]  # (count, d_model); the backward scatters the rows back, zeros elsewhere
        return F.linear(h, self.tgt_embed.weight, self.logits_bias)

    def init_state(self):
        """An empty DecoderState for incremental decoding."""
        return DecoderState(len(self.decoder.layers))

    def forward(self, src, tgt_in, src_mask=None, tgt_mask=None, positions=None, packed=False):
        """Teacher-forced logits (batch, len_tgt, tgt_vocab) for target inputs ``tgt_in``; with
        ``positions`` (boolean, the shape of ``tgt_in``) only theirs, (count, tgt_vocab) (see ``decode``).

        ``packed=True`` computes the same logits (up to rounding; dropout draws other masks) without
        the padding (``nn.packing``): the encoder runs on the source positions that are not
        ``pad_id``, the decoder on each target up to its last position that is not padding (or in
        ``positions``), and attention alone sees the padded layout. It returns the logits of
        ``positions`` (default: the targets' positions that are not padding), (count, tgt_vocab).
        Its masks are the padding's: no ``src_mask`` or ``tgt_mask``."""
        _check_ids_2d(src, "src")
        _check_ids_2d(tgt_in, "tgt_in")
        _check_positions(positions, tgt_in, "tgt_in")
        if src.shape[0] != tgt_in.shape[0]:
            raise ValueError(f"Transformer: src {tuple(src.shape)} and tgt_in {tuple(tgt_in.shape)} must hold "
                             "the same number of sentences (batch)")
        if packed:
            return self._forward_packed(src, tgt_in, src_mask, tgt_mask, positions)
        if src_mask is None:
            src_mask = self.source_mask(src)
        memory = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask, tgt_mask, positions=positions)

    def _forward_packed(self, src, tgt_in, src_mask, tgt_mask, positions):
        if src_mask is not None or tgt_mask is not None:
            raise ValueError("Transformer: packed=True hides the padding itself; give no src_mask or tgt_mask")
        src_ids, tgt_ids = _host_ids(src), _host_ids(tgt_in)
        positions = tgt_ids != self.pad_id if positions is None else _host_ids(positions)
        src_rows = PackedRows(src_ids != self.pad_id)
        tgt_rows = PackedRows.prefixes((tgt_ids != self.pad_id) | positions)
        src_mask = self.source_mask(src)
        memory = self.encoder(src_rows.pack(self._embed(self.src_embed, src)), src_mask, src_rows)
        h = self.decoder(tgt_rows.pack(self._embed(self.tgt_embed, tgt_in)), memory, src_mask, None,
                         rows=tgt_rows, memory_rows=src_rows)
        chosen = tgt_rows.select(positions)
        if chosen is not None:
            h = h[chosen]
        return F.linear(h, self.tgt_embed.weight, self.logits_bias)

    def extra_repr(self):
        c = self.config
        encoder_layers, decoder_layers = len(self.encoder.layers), len(self.decoder.layers)
        depth = encoder_layers if encoder_layers == decoder_layers else f"{encoder_layers}+{decoder_layers}"
        return (f"N={depth}, d_model={c.d_model}, d_ff={c.d_ff}, heads={c.heads}, "
                f"vocab={self.src_vocab_size}" + ("" if self.shared_vocab else f"/{self.tgt_vocab_size}")
                + ("" if c.positional == "sinusoid" else f", positional={c.positional}")
                + ("" if c.final_norm is None else f", final_norm={c.final_norm}")
                + ("" if c.init == "xavier" else f", init={c.init}")
                + ("" if c.activation == "relu" else f", activation={c.activation}")
                + ("" if c.scale_embedding else ", scale_embedding=False")
                + (", logits_bias=True" if c.logits_bias else ""))


def _config_of(config, fields):
    """The TransformerConfig ``Transformer(config, **fields)`` builds: ``config`` itself, or one made of
    ``fields`` (the convenience); its vocabulary must be set."""
    if config is None:
        TransformerConfig.check_names(fields)
        config = TransformerConfig(**fields)
    elif not isinstance(config, TransformerConfig):
        hint = ("TransformerConfig.from_dict(d)" if isinstance(config, dict) else
                f"src_vocab_size={config!r}" if isinstance(config, (int, numpy.integer)) else "TransformerConfig(...)")
        raise TypeError(f"Transformer: expected a TransformerConfig or its fields as keywords, got "
                        f"{type(config).__name__}; give {hint}")
    elif fields:
        raise TypeError(f"Transformer: give a TransformerConfig or its fields as keywords, not both (got "
                        f"{', '.join(fields)}); config.replace({next(iter(fields))}=...) changes a config")
    if config.src_vocab_size is None:
        raise TypeError("Transformer: src_vocab_size is unset (a preset leaves the vocabulary to you: "
                        "from_preset(name, vocab_size=...))")
    return config


def _torch_init(*stacks, generator=None):
    """Redraw the stacks' weights as PyTorch's nn.Transformer initialises them (``init="torch"``,
    ``nn.init.INIT_SCHEMES``): per attention, W_Q, W_K, W_V cut from one Xavier-uniform packed
    (3 d_model, d_model) matrix (its in_proj_weight), W_O Xavier-uniform, all four biases zero; per
    feed-forward network, W_1 and W_2 Xavier-uniform and their biases U(±1/√fan_in). LayerNorms keep
    gain 1 and bias 0. Modules in the order of ``modules()``."""
    for stack in stacks:
        for module in stack.modules():
            if isinstance(module, MultiHeadAttention):
                d = module.d_model
                for linear, weight in zip((module.w_q, module.w_k, module.w_v),
                                          init.packed_xavier_uniform(3, d, d, generator)):
                    linear.weight.data[...] = weight
                module.w_o.weight.data[...] = init.xavier_uniform(d, d, generator)
                for linear in (module.w_q, module.w_k, module.w_v, module.w_o):
                    linear.bias.data[...] = 0
            elif isinstance(module, PositionwiseFeedForward):
                for linear in (module.linear1, module.linear2):
                    linear.weight.data[...] = init.xavier_uniform(linear.out_features, linear.in_features, generator)
                    linear.bias.data[...] = init.fan_in_uniform(linear.out_features, linear.in_features, generator)


def _check_positions(positions, tgt, name="tgt"):
    """``positions`` must be None or a boolean array of ``tgt``'s shape; raise naming both otherwise."""
    if positions is None:
        return
    shape, dtype = getattr(positions, "shape", None), getattr(positions, "dtype", None)
    if shape is None or dtype is None or dtype.kind != "b":
        raise TypeError(f"Transformer: positions must be a boolean array of {name}'s shape {tuple(tgt.shape)}, "
                        f"got {f'dtype {dtype}' if dtype is not None else type(positions).__name__}")
    if tuple(shape) != tuple(tgt.shape):
        raise ValueError(f"Transformer: positions must have {name}'s shape {tuple(tgt.shape)}, got {tuple(shape)}")


def _host_ids(ids):
    """Ids or a mask as a NumPy array (the packed rows are counted on the host)."""
    ids = getattr(ids, "data", ids) if not hasattr(ids, "dtype") else ids
    return ids.get() if hasattr(ids, "get") and not isinstance(ids, numpy.ndarray) else numpy.asarray(ids)


def _check_ids_2d(ids, name):
    shape = getattr(ids, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be an integer array of token ids (batch, len), got {type(ids).__name__}")
    if len(shape) != 2:
        raise ValueError(f"{name} must be token ids of shape (batch, len), got shape {tuple(shape)}")
