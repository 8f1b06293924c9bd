"""The basic layers: Linear, Embedding, LayerNorm, Dropout, PositionalEncoding, feed-forward."""

import math

from .. import functional as F
from ..tensor import Tensor
from . import init
from .module import Module, Parameter

__all__ = ["Linear", "Embedding", "LayerNorm", "Dropout", "PositionalEncoding",
           "PositionwiseFeedForward"]


def _check_positive(name, value):
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class Linear(Module):
    """y = x Wᵀ + b, W of shape (out_features, in_features), Xavier-uniform, b zero."""

    def __init__(self, in_features, out_features, bias=True, generator=None):
        super().__init__()
        _check_positive("in_features", in_features)
        _check_positive("out_features", out_features)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(init.xavier_uniform(out_features, in_features, generator))
        self.bias = Parameter(init.zeros(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A (vocab_size, d_model) lookup table, initialised N(0, d_model^-0.5) (as in fairseq)."""

    def __init__(self, vocab_size, d_model, generator=None):
        super().__init__()
        _check_positive("vocab_size", vocab_size)
        _check_positive("d_model", d_model)
        self.vocab_size, self.d_model = vocab_size, d_model
        self.weight = Parameter(init.normal((vocab_size, d_model), d_model ** -0.5, generator))

    def forward(self, ids):
        return F.embedding(ids, self.weight)

    def extra_repr(self):
        return f"{self.vocab_size}, {self.d_model}"


class LayerNorm(Module):
    """Layer normalisation over the last axis with a learned gain (1) and bias (0)."""

    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        _check_positive("d_model", d_model)
        self.d_model, self.eps = d_model, eps
        self.weight = Parameter(init.ones(d_model))
        self.bias = Parameter(init.zeros(d_model))

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.d_model}, eps={self.eps}"


class Dropout(Module):
    """Inverted dropout with probability ``p`` in training mode, the identity in eval mode."""

    def __init__(self, p=0.1, generator=None):
        super().__init__()
        F._check_probability(p, "Dropout: p")
        self.p, self.generator = p, generator

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.generator)

    def extra_repr(self):
        return f"p={self.p}"


class PositionalEncoding(Module):
    """Adds the fixed sinusoids of §3.5, precomputed for positions 0 .. max_len − 1."""

    def __init__(self, d_model, max_len=1024):
        super().__init__()
        _check_positive("d_model", d_model)
        _check_positive("max_len", max_len)
        self.d_model, self.max_len = d_model, max_len
        self.register_buffer("table", F.sinusoid_table(max_len, d_model))

    def forward(self, x, offset=0):
        """x (batch, len, d_model) plus the encodings of positions offset .. offset + len − 1."""
        length = x.shape[-2]
        if offset + length > self.max_len:
            raise ValueError(
                f"PositionalEncoding: positions up to {offset + length - 1} requested (length "
                f"{length} at offset {offset}) but max_len is {self.max_len}; build the model "
                "with a larger max_len"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(f"PositionalEncoding: input has {x.shape[-1]} features, expected {self.d_model}")
        table = self.table[offset:offset + length]
        if table.dtype != x.dtype:
            table = table.astype(x.dtype)
        return x + Tensor(table)

    def extra_repr(self):
        return f"{self.d_model}, max_len={self.max_len}"


class PositionwiseFeedForward(Module):
    """FFN(x) = max(0, x W₁ + b₁) W₂ + b₂, applied at every position alike (§3.3)."""

    def __init__(self, d_model, d_ff, dropout=0.0, generator=None):
        super().__init__()
        self.linear1 = Linear(d_model, d_ff, generator=generator)
        self.linear2 = Linear(d_ff, d_model, generator=generator)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        return self.linear2(self.dropout(self.linear1(x).relu()))


def scale_embedding(x, d_model):
    """Embeddings are multiplied by √d_model before the positional encoding is added (§3.4)."""
    return x * math.sqrt(d_model)
