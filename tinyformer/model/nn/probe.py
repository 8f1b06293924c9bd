"""The probe API of ``MultiHeadAttention``: what attention recorded (``AttentionProbe``, its
``probe``) and the attention it calls (``Attention``, its ``attention``), the two doors through which
whoever studies the model (the explain page, the course's swap, a notebook) reads and replaces it.

As PyTorch's forward hooks and transformers' ``output_attentions`` / attention interface: the
module's forward is the projections, one call of ``attention.heads`` and the output; what it
records goes to ``probe`` and nowhere else, and nothing outside patches the module or engine ops.
"""

import contextlib
import dataclasses

from ...engine import functional as F
from ...engine.tensor import Tensor, is_grad_enabled

__all__ = ["Attention", "AttentionCall", "AttentionProbe", "attention_swapped"]


class AttentionProbe:
    """What one ``MultiHeadAttention`` keeps of its last forward pass (``mha.probe``).

    ``keep`` is the recording switch. While it is on, each forward keeps ``probs``, the
    probabilities P = softmax(QKᵀ/√d_k) of every head (batch, heads, len_q, len_k); ``inputs``, the
    heads' Q, K, V (batch, heads, len, d_k); and ``heads_output``, O = Dropout(P)·V (batch, heads,
    len_q, d_k), the input of W_O. In a pass that records the graph they are graph tensors, so
    ``probs.register_hook(fn)`` / ``retain_grad()`` give dL/dP = dO·Vᵀ, and O's give dL/dO (the hook
    point: the module then computes O from P with tensor ops, the same values as the fused node's).
    Off, they are None. ``weights`` is a detached copy of P for a call that asked for it
    (``need_weights``), whatever ``keep`` says. ``offset``, an array of O's shape or None, is added
    to O in every call while set (the explain page's finite differences along P and S).
    """

    def __init__(self, keep=False):
        self.keep = bool(keep)
        self.offset = None
        self.probs = self.inputs = self.heads_output = self.weights = None

    def attend(self, heads, q, k, v, mask, causal, dropout_p, generator, need_weights):
        """O of the heads through ``heads`` (``Attention.heads``'s contract), recording what the
        switch asks for. Recording with a graph: P from ``heads`` and O = Dropout(P)·V with tensor
        ops (the hook point, one extra P·V product); otherwise one call, P returned only where kept."""
        if self.keep and is_grad_enabled():
            # Only the probabilities output is used: its backward is softmax's and QKᵀ's.
            _, probs = heads(q, k, v, mask=mask, causal=causal, return_weights=True)
            out = F.dropout(probs, dropout_p, generator=generator) @ v
        else:
            kept = self.keep or need_weights
            result = heads(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, return_weights=kept,
                           generator=generator)
            out, probs = result if kept else (result, None)
        if self.offset is not None:
            out = out + Tensor(self.offset)
        self.probs, self.inputs, self.heads_output = (probs, (q, k, v), out) if self.keep else (None, None, None)
        self.weights = probs.detach() if need_weights else None
        return out


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One call of a ``MultiHeadAttention`` as ``Attention.module`` receives it: ``query``, ``key`` and
    ``value`` (batch, len, d_model) in the padded layout (packed rows already unpacked), the keep-mask
    and the causal flag. ``pack(output)`` puts an output of the padded layout back into the call's
    layout (packed rows when the query came as packed rows)."""

    query: Tensor
    key: Tensor
    value: Tensor
    mask: object
    causal: bool
    query_rows: object = None

    def pack(self, output):
        return output if self.query_rows is None else self.query_rows.pack(output)


class Attention:
    """The attention a ``MultiHeadAttention`` calls (``mha.attention``); this one is tinyformer's own.

    ``heads(q, k, v, mask=None, causal=False, dropout_p=0.0, return_weights=False, generator=None)``
    attends on (batch, heads, len, d_k) tensors with ``F.scaled_dot_product_attention``'s contract
    (O, or (O, P) with ``return_weights``): the one call of the heads' attention every forward makes.
    ``module(mha, call)`` may replace the whole module (projections included) on a call that keeps
    nothing and has no decoding cache: it gets an ``AttentionCall`` and returns the output (batch,
    len_q, d_model) with W_O's bias added, or None to let the module run its own; here it is None.
    A reader's attention subclasses this and overrides either (``attention_swapped`` puts it in).
    """

    module = None

    @staticmethod
    def heads(q, k, v, mask=None, causal=False, dropout_p=0.0, return_weights=False, generator=None):
        return F.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p,
                                              return_weights=return_weights, generator=generator)


@contextlib.contextmanager
def attention_swapped(model, attention):
    """A with-block during which every ``MultiHeadAttention`` of ``model`` (a Module) calls
    ``attention`` (an ``Attention``); on leaving, however the block ends, each has its own back."""
    if not isinstance(attention, Attention):
        raise TypeError(f"attention_swapped: attention must be an nn.probe.Attention, got {type(attention).__name__}")
    modules = [m for m in model.modules() if isinstance(vars(m).get("attention"), Attention)]
    before = [m.attention for m in modules]
    try:
        for module in modules:
            module.attention = attention
        yield modules
    finally:
        for module, own in zip(modules, before):
            module.attention = own
