"""Embedding lookup: rows of a (vocab, d) matrix picked by integer ids (§3.4); and the Transformer's
whole input, dropout(W[ids] · scale + positions) (§3.4, §3.5, §5.4), as one node."""

from .. import backend, kernels
from ..kernels import embedding as embedding_kernel
from ..random import kernel_seed
from ..tensor import Function, Tensor
from ...common.validation import check_probability, check_real, rectangular_array
from ._dispatch import KernelFunction
from ._targets import target_array
from .dropout import _check_generator, _dropped, _scale, _scaled_by_mask

_xp = backend.get_array_module


def _weight_gradient(g, ids, vocab, target):
    """dW of the rows ``g`` picked by ``ids`` (a scatter add, repeats adding up): into ``target``
    (returning None) where given, else a new array. kernels/embedding.cu where the kernels run."""
    rows = g.reshape(-1, vocab[1])
    if kernels.use_kernels(g):
        grad = embedding_kernel.embedding_backward(ids, rows, vocab[0], grad_weight=target)
    else:
        grad = _xp(g).zeros(vocab, dtype=g.dtype) if target is None else target
        backend.scatter_add_rows(grad, ids.reshape(-1), rows)
    return None if target is not None else grad


class Embedding(Function):
    """y = W[ids];  dW = Σ over positions of dy scattered back to each id (repeats add up), added
    straight into W's gradient where the engine offers it (``grad_targets``).

    On the GPU dW comes from kernels/embedding.cu, which sums each row's terms in position order
    (CuPy's scatter add uses atomics: its sums' order, and so their last bits, vary from run to run).
    """

    accepts_grad_targets = fresh_input_grads = True

    def forward(self, weight, ids):
        self.ids, self.vocab = ids, weight.shape
        return weight[ids]

    def backward(self, g):
        target = target_array(self.grad_targets[0], g.dtype) if self.grad_targets else None
        return _weight_gradient(g, self.ids, self.vocab, target), None


class EmbeddingInput(KernelFunction):
    """out = dropout(W[ids] · scale + table, p): the embedding's rows, scaled (√d_model in the paper),
    plus the position signal (``table``: one row per position of ids' last axis, or None), through
    dropout, as one node: the same values, mask and generator draws as ``embedding``, a product, a
    sum and ``dropout``, without their intermediates (on the GPU one launch each way instead of four,
    kernels/embedding.cu, the mask dropout.cu's for the drawn seed).

    Backward: dW = the scatter add of dy ∘ keep / (1 − p) · scale into the ids' rows, added straight
    into W's gradient where the engine offers it (``grad_targets``).
    """

    accepts_grad_targets = fresh_input_grads = True

    def check_forward(self, weight, ids, table, scale, p, generator):
        if table is not None and table.shape != (ids.shape[-1], weight.shape[1]):
            raise ValueError(f"embedding_input: table must be (length, d) = ({ids.shape[-1]}, {weight.shape[1]}) for "
                             f"ids of shape {tuple(ids.shape)}, got {table.shape}")

    def kernel_applies(self, weight, ids, table, scale, p, generator):
        return kernels.use_kernels(weight) and (table is None or table.dtype == weight.dtype)

    def forward_reference(self, weight, ids, table, scale, p, generator):
        self.ids, self.vocab, self.scale, self.p = ids, weight.shape, scale, p
        x = weight[ids]  # a copy of the rows (integer indexing): ours to change in place
        if scale != 1.0:
            x *= scale  # a Python float: x's dtype, as the Tensor product does
        if table is not None:
            x += table
        if p:
            self.drop_scale = _scale(x, p)
            x, self.keep = _dropped(x, p, generator, out=x)
        return x

    def backward_reference(self, g):
        if self.p:
            g = _scaled_by_mask(g, self.keep, self.drop_scale)
        if self.scale != 1.0:
            g = g * self.scale
        target = target_array(self.grad_targets[0], g.dtype) if self.grad_targets else None
        return _weight_gradient(g, self.ids, self.vocab, target), None, None, None, None, None

    def forward_kernel(self, weight, ids, table, scale, p, generator):
        self.ids, self.vocab, self.scale = ids, weight.shape, scale
        self.drop_scale = float(_scale(weight, p)) if p else 1.0
        out, self.keep = embedding_kernel.embedding_forward(ids, weight, table, scale, p,
                                                            kernel_seed(generator) if p else 0,
                                                            drop_scale=self.drop_scale)
        return out

    def backward_kernel(self, g):
        target = target_array(self.grad_targets[0], g.dtype) if self.grad_targets else None
        grad = embedding_kernel.embedding_backward(self.ids, g.reshape(-1, self.vocab[1]), self.vocab[0],
                                                   keep=self.keep, factor=self.drop_scale * self.scale,
                                                   grad_weight=target)
        return (None if target is not None else grad), None, None, None, None, None


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


def embedding_input(ids, weight, scale=1.0, table=None, p=0.0, training=True, generator=None):
    """dropout(embedding(ids, weight) · scale + table, p, training, generator) as one op: the
    Transformer's input. ``table``: (ids.shape[-1], d), the position signal of each position of ids'
    last axis (a constant: no gradient), or None; output shape ids.shape + (d,)."""
    if weight.ndim != 2:
        raise ValueError(f"embedding_input: weight must be 2-D (vocab, d), got shape {weight.shape}")
    ids = _check_ids(ids, 0, weight.shape[0], "embedding_input: ids")
    if ids.ndim == 0:
        raise ValueError("embedding_input: ids need a position axis, got a 0-d array")
    p = check_probability("embedding_input: p", p)
    _check_generator(generator, "embedding_input: generator")
    table = table.data if isinstance(table, Tensor) else table
    return EmbeddingInput.apply(weight, backend.like(ids, weight.data), table, check_real("embedding_input: scale", scale),
                                p if training else 0.0, generator)
