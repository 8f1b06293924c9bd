"""The basic layers: Linear, Embedding, LayerNorm, Dropout, positional encodings, feed-forward."""

import math

from ...engine import functional as F
from ...engine.tensor import Tensor
from ...common.validation import check_int, check_probability, check_real
from . import init
from .module import Module, Parameter
from .output_bias import LeavesOutputBias

__all__ = ["Linear", "Embedding", "LayerNorm", "Dropout", "PositionalEncoding",
           "LearnedPositionalEmbedding", "POSITIONAL_KINDS", "positional_encoding",
           "PositionwiseFeedForward"]


class Linear(Module):
    """y = x Wᵀ + b, W of shape (out_features, in_features), Xavier-uniform, b zero."""

    def __init__(self, in_features, out_features, bias=True, generator=None):
        super().__init__()
        check_int("in_features", in_features, 1)
        check_int("out_features", out_features, 1)
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
        check_int("vocab_size", vocab_size, 1)
        check_int("d_model", d_model, 1)
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
        check_int("d_model", d_model, 1)
        check_real("LayerNorm: eps", eps, 0)
        self.d_model, self.eps = d_model, eps
        self.weight = Parameter(init.ones(d_model))
        self.bias = Parameter(init.zeros(d_model))

    def forward(self, x):
        if x.ndim == 0 or x.shape[-1] != self.d_model:
            raise ValueError(f"LayerNorm: input of shape {x.shape} must end in d_model={self.d_model} features")
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.d_model}, eps={self.eps}"


class Dropout(Module):
    """Inverted dropout with probability ``p`` in training mode, the identity in eval mode."""

    def __init__(self, p=0.1, generator=None):
        super().__init__()
        check_probability("Dropout: p", p)
        self.p, self.generator = p, generator

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.generator)

    def extra_repr(self):
        return f"p={self.p}"


class _Positions(Module):
    """What both kinds of position signal share: the (max_len, d_model) shape and its checks."""

    def __init__(self, d_model, max_len):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("max_len", max_len, 1)
        self.d_model, self.max_len = d_model, max_len

    def _check(self, x, offset):
        if x.ndim < 2:
            raise ValueError(f"{type(self).__name__}: input must be (batch, len, d_model) or (len, d_model), "
                             f"got shape {x.shape}")
        length = x.shape[-2]
        self._check_positions(length, offset)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"{type(self).__name__}: input has {x.shape[-1]} features, expected {self.d_model}")
        return length

    def _check_positions(self, length, offset):
        check_int(f"{type(self).__name__}: offset", offset, 0)
        if offset + length > self.max_len:
            raise ValueError(
                f"{type(self).__name__}: positions up to {offset + length - 1} requested (length "
                f"{length} at offset {offset}) but max_len is {self.max_len}; build the model "
                "with a larger max_len"
            )

    def extra_repr(self):
        return f"{self.d_model}, max_len={self.max_len}"


class PositionalEncoding(_Positions):
    """Adds the fixed sinusoids of §3.5, precomputed for positions 0 .. max_len − 1 (``layout``: see
    ``F.sinusoid_table``; "split" is Marian's)."""

    def __init__(self, d_model, max_len=1024, layout="interleaved"):
        super().__init__(d_model, max_len)
        self.register_buffer("table", F.sinusoid_table(max_len, d_model, layout=layout))

    def forward(self, x, offset=0):
        """x (batch, len, d_model) plus the encodings of positions offset .. offset + len − 1."""
        return x + Tensor(self.rows(self._check(x, offset), offset, x.dtype))

    def rows(self, length, offset, dtype):
        """The encodings of positions offset .. offset + length − 1 as a (length, d_model) array of
        ``dtype`` (what ``forward`` adds; ``F.embedding_input`` takes it as its table)."""
        self._check_positions(length, offset)
        table = self.table[offset:offset + length]
        return table if table.dtype == dtype else table.astype(dtype)


class LearnedPositionalEmbedding(_Positions):
    """Adds a learned vector per position (§3.5, Table 3 row (E)) in place of the sinusoids.

    A (max_len, d_model) Parameter initialised N(0, d_model^-0.5) like the token
    embeddings (as fairseq's learned positions); position p's row receives the summed
    gradient of every sequence that reaches p.
    """

    def __init__(self, d_model, max_len=1024, generator=None):
        super().__init__(d_model, max_len)
        self.weight = Parameter(init.normal((max_len, d_model), d_model ** -0.5, generator))

    def forward(self, x, offset=0):
        """x (batch, len, d_model) plus the rows of positions offset .. offset + len − 1."""
        length = self._check(x, offset)
        return x + self.weight[offset:offset + length]


POSITIONAL_KINDS = ("sinusoid", "learned", "sinusoid_split")
ACTIVATIONS = ("relu", "silu", "gelu")  # the feed-forward network's: the paper's max(0, ·), x σ(x) or x Φ(x)


def positional_encoding(kind, d_model, max_len=1024, generator=None):
    """The position signal named ``kind``: "sinusoid" (fixed, §3.5), "learned" (Table 3 (E)) or
    "sinusoid_split" (the same sinusoids, sines first and cosines after them: Marian's)."""
    if kind == "sinusoid":
        return PositionalEncoding(d_model, max_len)
    if kind == "sinusoid_split":
        return PositionalEncoding(d_model, max_len, layout="split")
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_len, generator)
    raise ValueError(f"positional must be one of {', '.join(repr(k) for k in POSITIONAL_KINDS)}, got {kind!r}")


class PositionwiseFeedForward(LeavesOutputBias, Module):
    """FFN(x) = max(0, x W₁ + b₁) W₂ + b₂, applied at every position alike (§3.3); with
    ``activation="silu"``, h σ(h) with h = x W₁ + b₁ in place of the ReLU (Marian's "swish"); with
    ``"gelu"``, h Φ(h) (the exact GELU). b₂ may be left for the residual connection to add
    (``LeavesOutputBias``)."""

    def __init__(self, d_model, d_ff, dropout=0.0, generator=None, activation="relu"):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("d_ff", d_ff, 1)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(repr(a) for a in ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.linear1 = Linear(d_model, d_ff, generator=generator)
        self.linear2 = Linear(d_ff, d_model, generator=generator)
        self.dropout = Dropout(dropout)

    def forward(self, x):
        if self.activation != "relu":  # x σ(x) or x Φ(x): a linear layer, the op, dropout
            return self.output(self.linear2, self.dropout(getattr(self.linear1(x), self.activation)()))
        # = self.dropout(self.linear1(x).relu()), one node (on the GPU one matmul and one kernel)
        hidden = F.linear_relu_dropout(x, self.linear1.weight, self.linear1.bias, self.dropout.p, self.training,
                                       self.dropout.generator)
        return self.output(self.linear2, hidden)


def scale_embedding(x, d_model):
    """Embeddings are multiplied by √d_model before the positional encoding is added (§3.4)."""
    return x * math.sqrt(d_model)
