"""Embedding lookup: rows of a (vocab, d) matrix picked by integer ids (§3.4)."""

from .. import backend, kernels
from ..kernels import embedding as embedding_kernel
from ..tensor import Function, Tensor
from ...common.validation import rectangular_array

_xp = backend.get_array_module


class Embedding(Function):
    """y = W[ids];  dW = Σ over positions of dy scattered back to each id (repeats add up).

    On the GPU dW comes from kernels/embedding.cu, which sums each row's terms in position order
    (CuPy's scatter add uses atomics: its sums' order, and so their last bits, vary from run to run).
    """

    def forward(self, weight, ids):
        self.ids, self.vocab = ids, weight.shape
        return weight[ids]

    def backward(self, g):
        if kernels.use_kernels(g):
            return embedding_kernel.embedding_backward(self.ids, g.reshape(-1, self.vocab[1]), self.vocab[0]), None
        grad = _xp(g).zeros(self.vocab, dtype=g.dtype)
        backend.scatter_add_rows(grad, self.ids.reshape(-1), g.reshape(-1, self.vocab[1]))
        return grad, None


def _check_ids(ids, low, high, name):
    """``ids`` must be integers in [low, high); raise naming ``name`` otherwise."""
    ids = ids.data if isinstance(ids, Tensor) else ids
    if not hasattr(ids, "dtype"):
        ids = rectangular_array(ids, name)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {ids.dtype}")
    if ids.size and not backend.is_capturing() and (int(ids.min()) < low or int(ids.max()) >= high):
        raise IndexError(
            f"{name} must lie in [{low}, {high}), got values from {int(ids.min())} to "
            f"{int(ids.max())} (shape {tuple(ids.shape)})"
        )
    return ids


def embedding(ids, weight):
    """Rows of ``weight`` (vocab, d) picked by integer ``ids``: output shape ids.shape + (d,)."""
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (vocab, d), got shape {weight.shape}")
    ids = _check_ids(ids, 0, weight.shape[0], "embedding: ids")
    return Embedding.apply(weight, backend.like(ids, weight.data))
