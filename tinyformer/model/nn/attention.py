"""Multi-head attention (§3.2.2) with an optional key/value cache for incremental decoding."""

from ...engine import backend, functional as F
from ...engine.ops import concat
from ...common.validation import check_int, check_probability
from .layers import Linear
from .module import Module
from .output_bias import LeavesOutputBias
from .probe import Attention, AttentionCall, AttentionProbe

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(LeavesOutputBias, Module):
    """MultiHead(Q, K, V) = Concat(head₁, ..., head_h) W_O, headᵢ = Attention(Q W_Qᵢ, K W_Kᵢ, V W_Vᵢ).

    The h projections of size d_k = d_model / h are computed as one d_model × d_model
    matrix each for Q, K and V, then split into heads by reshape and transpose.
    ``dropout`` drops attention probabilities during training. ``generator``
    initialises the projections; dropout masks come from ``dropout_generator``,
    by default the one ``tinyformer.manual_seed`` resets.

    The probe API (``nn.probe``): ``probe``, an ``AttentionProbe``, holds what the module recorded,
    and ``attention``, an ``Attention``, is the attention it calls (tinyformer's own unless swapped,
    ``nn.probe.attention_swapped``). ``keep_attention`` (an argument, or an attribute to set at any
    time) is the probe's switch: while on, each forward keeps the probabilities
    P = softmax(QKᵀ/√d_k) of every head, (batch, heads, len_q, len_k), as ``attention_probs``
    (``probe.probs``), and the heads' inputs Q, K, V as ``attention_inputs``. In a pass that records
    the graph P is a graph tensor, the hook point for dL/dP (see ``forward``); under ``no_grad``
    (``nn.inference``) it is the values alone and the output is computed as with the switch off (on
    a GPU by the reference path, since the fused kernel never forms P). Off, both are None.
    ``forward(..., need_weights=True)`` asks one call for a detached copy of P, ``last_weights``,
    as PyTorch's argument of that name does.
    """

    def __init__(self, d_model, heads, dropout=0.0, generator=None, dropout_generator=None,
                 keep_attention=False):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("heads", heads, 1)
        if d_model % heads:
            raise ValueError(
                f"MultiHeadAttention: d_model={d_model} is not divisible by heads={heads}"
            )
        check_probability("MultiHeadAttention: dropout", dropout)
        self.d_model, self.heads, self.d_k, self.dropout = d_model, heads, d_model // heads, dropout
        self.dropout_generator = dropout_generator
        self.w_q = Linear(d_model, d_model, generator=generator)
        self.w_k = Linear(d_model, d_model, generator=generator)
        self.w_v = Linear(d_model, d_model, generator=generator)
        self.w_o = Linear(d_model, d_model, generator=generator)
        self.probe, self.attention = AttentionProbe(keep_attention), Attention()
        self.parameters_replaced()

    @property
    def keep_attention(self):
        """The recording switch, ``probe.keep``."""
        return self.probe.keep

    @keep_attention.setter
    def keep_attention(self, keep):
        self.probe.keep = bool(keep)

    attention_probs = property(lambda self: self.probe.probs, doc="P while kept (``probe.probs``).")
    attention_inputs = property(lambda self: self.probe.inputs, doc="The heads' Q, K, V while kept (``probe.inputs``).")
    last_weights = property(lambda self: self.probe.weights, doc="P of a ``need_weights`` call (``probe.weights``).")

    def parameters_replaced(self):
        """The queries', keys' and values' weights (and biases) packed back to back in one buffer, so
        that self-attention projects with one product and attention over a memory its keys and
        values with one (``F.linear_parts``); after ``to`` or ``load_state_dict`` too. Parameters
        that cannot be packed (different dtypes or devices) stay as they are: the products then run
        one by one, with the same results."""
        projections = (self.w_q, self.w_k, self.w_v)
        for name in ("weight", "bias"):
            params = [getattr(linear, name) for linear in projections]
            if any(p is None for p in params) or len({(p.data.dtype, backend.device_of(p.data)) for p in params}) != 1:
                continue
            if backend.back_to_back([p.data for p in params]) is None:
                for p, view in zip(params, backend.pack_back_to_back([p.data for p in params])):
                    p.data = view

    def _project(self, x, linears):
        """``x`` through each of ``linears`` (one product where their weights are packed)."""
        biases = [linear.bias for linear in linears]
        return F.linear_parts(x, [linear.weight for linear in linears], None if any(b is None for b in biases) else biases)

    @staticmethod
    def key_value_defaults(query, key, value, query_rows, key_rows):
        """(key, value, key_rows) as ``forward`` reads them: ``key`` defaults to ``query``
        (self-attention, and then ``key_rows`` to ``query_rows``), ``value`` to ``key``."""
        if key is None:
            key, key_rows = query, query_rows if key_rows is None else key_rows
        return key, key if value is None else value, key_rows

    def _split(self, x, rows=None):
        """(batch, len, d_model), or its packed ``rows`` (count, d_model) -> (batch, heads, len, d_k)."""
        if rows is not None:
            x = rows.unpack(x)
        batch, length = x.shape[0], x.shape[1]
        return x.reshape(batch, length, self.heads, self.d_k).transpose(0, 2, 1, 3)

    def _merge(self, x, rows=None):
        """(batch, heads, len, d_k) -> (batch, len, d_model), or its packed ``rows`` (count, d_model)."""
        batch, length = x.shape[0], x.shape[2]
        merged = x.transpose(0, 2, 1, 3).reshape(batch, length, self.d_model)
        return merged if rows is None else rows.pack(merged)

    def forward(self, query, key=None, value=None, mask=None, causal=False, cache=None,
                static_kv=False, need_weights=False, query_rows=None, key_rows=None):
        """Attend from ``query`` (batch, len_q, d_model) to ``key``/``value`` (batch, len_k, d_model).

        ``key`` and ``value`` default to ``query`` (self-attention). ``mask`` is a
        boolean keep-mask broadcastable to (batch, heads, len_q, len_k);
        ``causal=True`` hides later positions. ``cache`` (a dict, filled here) makes
        decoding incremental: for self-attention (``static_kv=False``) this step's
        keys and values are appended to the cached ones; for attention over a fixed
        memory (``static_kv=True``) they are projected once and reused. With
        ``need_weights=True`` the probabilities are kept in ``last_weights`` (detached).

        Packed rows (``nn.packing``): with ``query_rows`` (a ``PackedRows``) the query is its rows,
        (count, d_model), and so is the output; ``key_rows`` likewise for key and value (default:
        ``query_rows`` when the key is the query). The heads attend in the padded layout, where
        ``mask`` must hide the positions the rows leave out; the projections run on the rows only.

        The forward is the projections, one call of the heads' attention, ``attention.heads``, through
        the probe (``probe.attend``), and W_O; ``attention.module``, where set, replaces all three on a
        call without a cache that keeps nothing (``nn.probe``).

        The hook point (§3.2.1). By default attention is one fused node
        (``F.scaled_dot_product_attention``) and the output's gradient never passes
        through a probabilities tensor. With ``keep_attention`` on and the graph being
        recorded, the masked P is a graph tensor, ``self.attention_probs``, and the output
        is computed from it as Dropout(P)·V with tensor ops; so
        ``mha.attention_probs.retain_grad()`` or ``.register_hook(fn)`` after the forward
        pass sees dL/dP = dO·Vᵀ (times the dropout mask) for every head, where dO is the
        gradient at the heads' output before W_O. Outputs and every other gradient equal
        the fused path's; it costs one extra P·V product. Wherever P is kept, on a GPU the
        reference path runs instead of the fused kernel (which never forms P).
        """
        key, value, key_rows = self._checked_inputs(query, key, value, query_rows, key_rows, cache)
        if self.attention.module is not None and cache is None and not need_weights and not self.probe.keep:
            call = AttentionCall(*(x if rows is None else rows.unpack(x) for x, rows in
                                   ((query, query_rows), (key, key_rows), (value, key_rows))), mask, causal, query_rows)
            out = self.attention.module(self, call)
            if out is not None:
                return call.pack(out)
        q, k, v = self._heads_inputs(query, key, value, cache, static_kv, query_rows, key_rows)
        out = self.probe.attend(self.attention.heads, q, k, v, mask, causal, self.dropout if self.training else 0.0,
                                self.dropout_generator, need_weights)
        return self.output(self.w_o, self._merge(out, query_rows))  # W_O's bias may be the residual's to add

    def _checked_inputs(self, query, key, value, query_rows, key_rows, cache):
        """(key, value, key_rows) with their defaults (``key_value_defaults``), once the shapes are checked."""
        key, value, key_rows = self.key_value_defaults(query, key, value, query_rows, key_rows)
        for name, x, rows in (("query", query, query_rows), ("key", key, key_rows), ("value", value, key_rows)):
            if rows is not None:
                if x.shape != (rows.count, self.d_model):
                    raise ValueError(f"MultiHeadAttention: {name} must be its {rows.count} packed rows "
                                     f"({rows.count}, {self.d_model}), got shape {x.shape}")
            elif x.ndim != 3 or x.shape[-1] != self.d_model:
                raise ValueError(
                    f"MultiHeadAttention: {name} must be (batch, len, {self.d_model}), got shape {x.shape}"
                )
        batch_q = query.shape[0] if query_rows is None else query_rows.shape[0]
        key_shape = key.shape[:2] if key_rows is None else key_rows.shape
        if key_shape[0] not in (batch_q, 1) or (key_rows is None and value.shape[:2] != key.shape[:2]):
            raise ValueError(
                f"MultiHeadAttention: key {key.shape} and value {value.shape} need the same batch and "
                f"length, and that batch must be the query's ({batch_q}, from {query.shape}) or 1"
            )
        if cache is not None and (query_rows is not None or key_rows is not None):
            raise ValueError("MultiHeadAttention: a decoding cache works on the padded layout, not packed rows")
        return key, value, key_rows

    def _heads_inputs(self, query, key, value, cache, static_kv, query_rows, key_rows):
        """Q, K, V (batch, heads, len, d_k): projected (one product where they share an input), K and V
        appended to or taken from ``cache``, which then holds them."""
        cached = cache is not None and static_kv and "k" in cache
        if key is query and value is query and not cached:  # self-attention: Q, K and V in one product
            q, k, v = (self._split(y, query_rows) for y in self._project(query, (self.w_q, self.w_k, self.w_v)))
        else:
            q = self._split(self.w_q(query), query_rows)
        if cached:
            k, v = cache["k"], cache["v"]
        elif not (key is query and value is query):
            if value is key:  # attention over a memory: K and V in one product
                k, v = (self._split(y, key_rows) for y in self._project(key, (self.w_k, self.w_v)))
            else:
                k, v = self._split(self.w_k(key), key_rows), self._split(self.w_v(value), key_rows)
        if not cached and cache is not None and not static_kv and "k" in cache:
            k, v = concat([cache["k"], k], axis=2), concat([cache["v"], v], axis=2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        return q, k, v

    def extra_repr(self):
        return f"d_model={self.d_model}, heads={self.heads}, dropout={self.dropout}"
