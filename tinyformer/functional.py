"""Fused neural-network ops, each one Function with a backward derived by hand.

Composing softmax or layer norm from elementary ops works (the engine
differentiates anything), but it stores every intermediate and walks a dozen
graph nodes. Here each op is a single node whose backward is the closed-form
derivative, written beside its forward. The NumPy code is the reference; on
CuPy arrays the same code runs through CuPy.

Imported as ``from tinyformer import functional as F``.
"""

import math

import numpy

from . import backend, kernels
from .kernels import ops as kernel_ops
from .kernels.registry import HEAD_DIMS
from .ops._helpers import normalize_axes, sum_to_shape
from .random import default_generator, uniform_blocks, uniform_like
from .tensor import Function, Tensor
from .validation import as_array, check_int, check_probability, check_real, is_integer

__all__ = [
    "softmax",
    "log_softmax",
    "layer_norm",
    "dropout",
    "embedding",
    "linear",
    "cross_entropy",
    "nll_loss",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "sinusoid_table",
]


def _xp(*arrays):
    return backend.get_array_module(*arrays)


_KERNEL_DTYPES = (numpy.dtype(numpy.float32), numpy.dtype(numpy.float16))


def _use_kernel(*arrays):
    """The single switch between a CUDA kernel and the NumPy/CuPy reference: CuPy arrays of
    float32/float16 (float64, used by gradient checks, always takes the reference)."""
    return kernels.enabled(*arrays) and all(a.dtype in _KERNEL_DTYPES for a in arrays)


def _axis(axis, shape):
    """One axis as a non-negative int; None, a tuple or an empty axis is an error, not a silent choice."""
    if not shape:
        raise ValueError("needs at least one dimension")
    if not is_integer(axis):
        raise ValueError(f"axis must be a single int, got {axis!r}")
    axis = normalize_axes(axis, len(shape))[0]
    if shape[axis] == 0:
        raise ValueError(f"axis {axis} has length 0 (shape {tuple(shape)}): a distribution over no classes")
    return axis


# ------------------------------------------------------------------------ softmax
def _stable_softmax(x, axis):
    """exp(x - max) / Σ exp(x - max): the max shift keeps exp finite for any finite x."""
    e = _xp(x).exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Softmax(Function):
    """pᵢ = exp(xᵢ) / Σⱼ exp(xⱼ);  dx = p ∘ (dp − Σⱼ dpⱼ pⱼ)."""

    def forward(self, x, axis):
        self.axis = _axis(axis, x.shape)
        self.fused = _use_kernel(x) and self.axis == x.ndim - 1
        self.p = kernel_ops.softmax_forward(x) if self.fused else _stable_softmax(x, self.axis)
        return self.p

    def backward(self, g):
        p = self.p
        if self.fused:
            return kernel_ops.softmax_backward(p, g.astype(p.dtype, copy=False))
        return p * (g - (g * p).sum(axis=self.axis, keepdims=True))


class LogSoftmax(Function):
    """yᵢ = xᵢ − max − log Σⱼ exp(xⱼ − max);  dx = dy − softmax(x) · Σⱼ dyⱼ."""

    def forward(self, x, axis):
        xp = _xp(x)
        self.axis = axis = _axis(axis, x.shape)
        self.fused = _use_kernel(x) and axis == x.ndim - 1
        if self.fused:
            self.y = kernel_ops.softmax_forward(x, log=True)
            return self.y
        shifted = x - x.max(axis=axis, keepdims=True)
        y = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
        self.y = y
        return y

    def backward(self, g):
        if self.fused:
            return kernel_ops.softmax_backward(self.y, g.astype(self.y.dtype, copy=False), log=True)
        return g - _xp(g).exp(self.y) * g.sum(axis=self.axis, keepdims=True)


def softmax(x, axis=-1):
    """Softmax along ``axis``, max-subtracted (finite for |x| up to float range)."""
    return Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    """log(softmax(x)) along ``axis``, computed without forming softmax (no log(0))."""
    return LogSoftmax.apply(x, axis=axis)


# ------------------------------------------------------------------------ layer norm
class LayerNorm(Function):
    """y = x̂ ∘ w + b with x̂ = (x − μ) / √(σ² + eps) over the last axis (biased σ²).

    With r = 1/√(σ² + eps) and dx̂ = dy ∘ w, over the n features:
    dx = r · (dx̂ − mean(dx̂) − x̂ ∘ mean(dx̂ ∘ x̂));  dw = Σ dy ∘ x̂;  db = Σ dy
    (the last two summed over every axis but the last).
    """

    def forward(self, x, weight, bias, eps):
        n = x.shape[-1]
        if weight.shape != (n,) or bias.shape != (n,):
            raise ValueError(
                f"weight and bias must have shape ({n},) for {n} features, "
                f"got {weight.shape} and {bias.shape}"
            )
        self.weight = weight
        self.fused = _use_kernel(x, weight, bias)
        if self.fused:  # kernels/layer_norm.cu keeps μ and r per row instead of x̂
            y, self.mean, self.rstd = kernel_ops.layer_norm_forward(x, weight, bias, eps)
            self.x = x
            return y
        xp = _xp(x)
        rows = x.reshape(-1, n)
        xhat = xp.empty_like(rows)
        y = xp.empty(rows.shape, dtype=xp.result_type(x, weight, bias))
        rstd = xp.empty((len(rows), 1), dtype=x.dtype)

        def normalize(start, stop):  # rows [start, stop): x̂, r and y, in row blocks on several threads
            z, block = rows[start:stop], xhat[start:stop]
            xp.subtract(z, z.mean(axis=-1, keepdims=True), out=block)
            var = xp.einsum("ri,ri->r", block, block)[:, None] / n  # Σ (x − μ)², no temporary
            r = 1.0 / xp.sqrt(var + eps)
            if not bool(xp.isfinite(var).all()):
                r = _rescaled_rstd(xp, block, var, eps)
            rstd[start:stop] = r
            block *= rstd[start:stop]
            xp.multiply(block, weight, out=y[start:stop])
            y[start:stop] += bias

        backend.map_row_blocks(normalize, len(rows), x, row_size=n)
        self.xhat, self.rstd = xhat.reshape(x.shape), rstd.reshape(x.shape[:-1] + (1,))
        return y.reshape(x.shape)

    def backward(self, g):
        if self.fused:
            grad_x, grad_w, grad_b = kernel_ops.layer_norm_backward(
                self.x, self.weight, g.astype(self.x.dtype, copy=False), self.mean, self.rstd,
                need_input=self.needs_input_grad[0], need_params=any(self.needs_input_grad[1:3]))
            return grad_x, grad_w, grad_b, None
        xp, xhat = _xp(g), self.xhat
        n = xhat.shape[-1]
        rows_g, rows_xhat, rstd = g.reshape(-1, n), xhat.reshape(-1, n), self.rstd.reshape(-1, 1)
        need_x, need_w, need_b = self.needs_input_grad[:3]
        grad_x = xp.empty(rows_g.shape, dtype=xp.result_type(g, self.weight)) if need_x else None

        def gradient_rows(start, stop):  # dx of rows [start, stop); their share of dw and db
            g_block, xhat_block = rows_g[start:stop], rows_xhat[start:stop]
            if need_x:
                dxhat = grad_x[start:stop]
                xp.multiply(g_block, self.weight, out=dxhat)
                mean_dxhat_xhat = xp.einsum("ri,ri->r", dxhat, xhat_block)[:, None] / n
                dxhat -= dxhat.mean(axis=-1, keepdims=True)
                dxhat -= xhat_block * mean_dxhat_xhat
                dxhat *= rstd[start:stop]
            return (xp.einsum("ri,ri->i", g_block, xhat_block) if need_w else None,
                    g_block.sum(axis=0) if need_b else None)

        parts = backend.map_row_blocks(gradient_rows, len(rows_g), g, row_size=n)
        grad_w = sum((part[0] for part in parts[1:]), parts[0][0]) if need_w else None
        grad_b = sum((part[1] for part in parts[1:]), parts[0][1]) if need_b else None
        return (None if grad_x is None else grad_x.reshape(g.shape)), grad_w, grad_b, None


def _rescaled_rstd(xp, centered, var, eps):
    """1/√(σ² + eps) for rows whose Σ (x − μ)² overflowed (float32 values beyond ~1e19).

    With s = max |x − μ| per row, σ² = s² · mean(((x − μ)/s)²), so
    1/√(σ² + eps) = 1 / (s · √(mean(((x − μ)/s)²) + eps/s²)): nothing is squared before
    it is divided by s. Rows that did not overflow keep their value.
    """
    with numpy.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        scale = xp.abs(centered).max(axis=-1, keepdims=True)
        safe = xp.where(scale > 0, scale, 1)
        unit = centered / safe
        mean_sq = (unit * unit).mean(axis=-1, keepdims=True)
        rescaled = 1.0 / (safe * xp.sqrt(mean_sq + eps / (safe * safe)))
        direct = 1.0 / xp.sqrt(var + eps)
    return xp.where(xp.isfinite(var), direct, rescaled).astype(centered.dtype, copy=False)


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer normalisation over the last axis (Ba et al., 2016), eps inside the square root."""
    if x.ndim == 0:
        raise ValueError("layer_norm: x needs a feature axis, got a 0-d tensor")
    return LayerNorm.apply(x, weight, bias, check_real("layer_norm: eps", eps, 0))


# ------------------------------------------------------------------------ dropout
class Dropout(Function):
    """Inverted dropout: y = x ∘ m / (1 − p), m = [u ≥ p], u ~ U[0, 1);  dx = dy ∘ m / (1 − p).

    u comes from ``generator`` drawn on the host (``uniform_blocks`` for NumPy arrays, ``uniform_like``
    otherwise), or, where the kernels run
    (``_use_kernel``: CuPy arrays), from Philox on the device (kernels/dropout.cu), keyed by a
    seed drawn from ``generator``: no host draw, no copy. Both repeat for a seed; their masks differ.
    """

    def forward(self, x, p, generator):
        self.scale = x.dtype.type(1.0 / (1.0 - p))  # a NumPy scalar: CuPy takes it, not a 0-d array
        if _use_kernel(x):
            seed = int((generator or default_generator()).integers(2 ** 63))
            y, self.keep = kernel_ops.dropout_forward(x, p, seed, scale=float(self.scale))
            return y
        y, self.keep = _dropped(x, p, generator)
        return y

    def backward(self, g):
        return _scaled_by_mask(g, self.keep, self.scale)


def _scaled_by_mask(x, keep, scale):
    """x ∘ keep · scale in one new array, in element blocks on several threads when large."""
    xp = _xp(x)
    flat_x, flat_keep = xp.ascontiguousarray(x).reshape(-1), keep.reshape(-1)
    out = xp.empty(flat_x.shape, dtype=xp.result_type(x, scale))

    def block(start, stop):
        xp.multiply(flat_x[start:stop], flat_keep[start:stop], out=out[start:stop])
        out[start:stop] *= scale

    backend.map_row_blocks(block, flat_x.size, x)
    return out.reshape(x.shape)


def _dropped(x, p, generator):
    """(x ∘ keep / (1 − p), keep) with keep = [u ≥ p] (boolean: 1 byte per element), u the uniform
    samples of one ``generator.random(x.shape, float32)`` draw. For NumPy x, mask and output are
    made block by block as the samples come (``uniform_blocks``, several threads), never holding
    the samples; other arrays take one ``uniform_like`` draw on the host."""
    scale = x.dtype.type(1.0 / (1.0 - p))
    if _xp(x) is not numpy:
        keep = uniform_like(generator, x.shape, x) >= p
        return _scaled_by_mask(x, keep, scale), keep
    flat_x = numpy.ascontiguousarray(x).reshape(-1)
    keep = numpy.empty(flat_x.shape, dtype=bool)
    out = numpy.empty(flat_x.shape, dtype=x.dtype)

    def block(start, stop, samples):
        numpy.greater_equal(samples, p, out=keep[start:stop])
        numpy.multiply(flat_x[start:stop], keep[start:stop], out=out[start:stop])
        out[start:stop] *= scale

    uniform_blocks(generator, flat_x.size, block)
    return out.reshape(x.shape), keep.reshape(x.shape)


def _check_generator(generator, name):
    if generator is not None and not isinstance(generator, numpy.random.Generator):
        raise TypeError(f"{name} must be a numpy.random.Generator or None (the default generator), "
                        f"got {type(generator).__name__}")


def dropout(x, p=0.1, training=True, generator=None):
    """Zero each element with probability ``p`` and scale the rest by 1/(1 − p) (residual dropout, §5.4).

    The identity when ``training`` is false or ``p == 0``. Masks are drawn from
    ``generator`` (a ``numpy.random.Generator``), or from the default generator
    that ``tinyformer.manual_seed`` resets. On the GPU with the kernels on, only a
    seed is drawn from it and the mask is made on the device (Philox): GPU runs
    repeat for a seed, but their masks differ from the CPU's.
    """
    p = check_probability("dropout: p", p)
    _check_generator(generator, "dropout: generator")
    if not training or p == 0:
        return x
    return Dropout.apply(x, p, generator)


# ------------------------------------------------------------------------ embedding
def _check_ids(ids, low, high, name):
    """``ids`` must be integers in [low, high); raise naming ``name`` otherwise."""
    ids = ids.data if isinstance(ids, Tensor) else ids
    if not hasattr(ids, "dtype"):
        ids = as_array(ids, name)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {ids.dtype}")
    if ids.size and (int(ids.min()) < low or int(ids.max()) >= high):
        raise IndexError(
            f"{name} must lie in [{low}, {high}), got values from {int(ids.min())} to "
            f"{int(ids.max())} (shape {tuple(ids.shape)})"
        )
    return ids


class Embedding(Function):
    """y = W[ids];  dW = Σ over positions of dy scattered back to each id (repeats add up)."""

    def forward(self, weight, ids):
        self.ids, self.vocab = ids, weight.shape
        return weight[ids]

    def backward(self, g):
        grad = _xp(g).zeros(self.vocab, dtype=g.dtype)
        backend.scatter_add_rows(grad, self.ids.reshape(-1), g.reshape(-1, self.vocab[1]))
        return grad, None


def embedding(ids, weight):
    """Rows of ``weight`` (vocab, d) picked by integer ``ids``: output shape ids.shape + (d,)."""
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (vocab, d), got shape {weight.shape}")
    ids = _check_ids(ids, 0, weight.shape[0], "embedding: ids")
    return Embedding.apply(weight, backend.like(ids, weight.data))


# ------------------------------------------------------------------------ linear
class Linear(Function):
    """y = x Wᵀ + b with W of shape (out, in);  dx = dy W, dW = dyᵀ x, db = Σ dy.

    dW and db are single products over the flattened batch (no per-example temporaries).
    """

    def forward(self, x, weight, bias=None):
        if weight.ndim != 2:
            raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {weight.shape}")
        if x.ndim == 0:
            raise ValueError("input needs a feature axis, got a 0-d array")
        if x.shape[-1] != weight.shape[1]:
            raise ValueError(
                f"input has {x.shape[-1]} features but weight expects {weight.shape[1]}"
            )
        if bias is not None and bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},) for {weight.shape[0]} output "
                             f"features, got {bias.shape}")
        self.x, self.weight = x, weight
        # One GEMM over the flattened batch (matmul on a 3-D x would loop over the batch).
        y = x.reshape(-1, x.shape[-1]) @ weight.T
        self._epilogue(y, bias)
        return y.reshape(x.shape[:-1] + (weight.shape[0],))

    def _epilogue(self, y, bias):
        """Adds the bias in place (y is ours: no second (batch, out) array), in row blocks."""
        def add_bias(start, stop):
            y[start:stop] += bias

        if bias is not None:
            backend.map_row_blocks(add_bias, len(y), y, row_size=y.shape[1])

    def backward(self, g):
        need_x, need_w, need_b = (tuple(self.needs_input_grad) + (False,))[:3]
        g2 = g.reshape(-1, g.shape[-1])
        grad_x = (g2 @ self.weight).reshape(self.x.shape) if need_x else None
        grad_w = g2.T @ self.x.reshape(-1, self.x.shape[-1]) if need_w else None
        grad_b = g2.sum(axis=0) if need_b else None
        return grad_x, grad_w, grad_b


class LinearRelu(Linear):
    """z = max(0, x Wᵀ + b), the first layer of the position-wise feed-forward net (§3.3), as one
    node: the ReLU runs in place on the product, keeping only the mask m = [z > 0];
    dz/d(x Wᵀ + b) = m, then Linear's backward."""

    def _epilogue(self, y, bias):
        self.positive = positive = _xp(y).empty(y.shape, dtype=bool)

        def rows(start, stop):  # bias, mask and ReLU in one cache-resident pass per row block
            block = y[start:stop]
            if bias is not None:
                block += bias
            _xp(y).greater(block, 0, out=positive[start:stop])
            _xp(y).maximum(block, 0, out=block)

        backend.map_row_blocks(rows, len(y), y, row_size=y.shape[1])

    def backward(self, g):
        positive = self.positive.reshape(g.shape)
        return super().backward(backend.blockwise(_xp(g).multiply, g, positive))


def linear_relu(x, weight, bias=None):
    """max(0, x Wᵀ + b) in one node (see LinearRelu): the same values and gradients as
    ``linear(x, weight, bias).relu()`` without the second (batch, out) array."""
    if bias is None:
        return LinearRelu.apply(x, weight)
    return LinearRelu.apply(x, weight, bias)


def linear(x, weight, bias=None):
    """x Wᵀ + b: the affine map of a linear layer, weight stored (out_features, in_features)."""
    if bias is None:
        return Linear.apply(x, weight)
    return Linear.apply(x, weight, bias)


# ------------------------------------------------------------------------ cross entropy
_REDUCTIONS = ("mean", "sum", "none")


class CrossEntropy(Function):
    """Label-smoothed cross entropy fused with log-softmax, plus the plain NLL.

    With p = softmax(z) over V classes and target distribution
    q = (1 − ε)·onehot(t) + ε/V (Szegedy et al., 2016):
    loss = −Σᵥ qᵥ log pᵥ and nll = −log pₜ, so dz = (p − q)·dloss + (p − onehot)·dnll.
    Positions whose target is ``ignore_index`` count for nothing; "mean" divides by
    the number of the other positions.
    """

    def forward(self, logits, target, smoothing, ignore_index, reduction):
        xp = _xp(logits)
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        t = target.reshape(-1)
        keep = xp.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
        self.fused = _use_kernel(logits)
        if self.fused:
            return self._fused_forward(flat, t, keep, smoothing, ignore_index, reduction, target.shape)
        t_safe = xp.where(keep, t, 0)
        rows = xp.arange(len(t))
        # One (N, V) buffer holds z − max, then exp of it, then p; log p is never materialised:
        # log pₜ = shiftedₜ − log Z and Σᵥ log pᵥ = Σᵥ shiftedᵥ − V·log Z.
        p = xp.empty_like(flat)

        def softmax_rows(start, stop):  # rows [start, stop) of p; returns shiftedₜ, Σ shifted, Z
            z, out = flat[start:stop], p[start:stop]
            xp.subtract(z, z.max(axis=-1, keepdims=True), out=out)
            target_value = out[rows[: stop - start], t_safe[start:stop]]
            shifted_total = out.sum(axis=-1) if smoothing else None
            xp.exp(out, out=out)
            z_total = out.sum(axis=-1)
            out /= z_total[:, None]
            return target_value, shifted_total, z_total

        blocks = backend.map_row_blocks(softmax_rows, len(t), flat, row_size=vocab)
        shifted_target = xp.concatenate([b[0] for b in blocks])
        shifted_sum = xp.concatenate([b[1] for b in blocks]) if smoothing else None
        total = xp.concatenate([b[2] for b in blocks])
        log_z = xp.log(total)
        nll = log_z - shifted_target
        if smoothing:
            sum_logp = shifted_sum - vocab * log_z
            loss = (1.0 - smoothing) * nll - (smoothing / vocab) * sum_logp
        else:
            loss = nll
        self.p, self.t_safe, self.rows = p, t_safe, rows
        self.smoothing, self.shape, self.reduction = smoothing, logits.shape, reduction
        return self._reduce(loss, nll, keep, target.shape, logits.dtype)

    def _reduce(self, loss, nll, keep, target_shape, dtype, weight_dtype=None):
        """Per-position loss and NLL weighted (ignored positions 0; 1/count for "mean") in
        ``weight_dtype`` (default ``dtype``), then reduced; results in ``dtype``."""
        weight = keep.astype(weight_dtype or dtype)
        self.count = count = int(keep.sum())
        if self.reduction == "mean":
            weight /= max(count, 1)
        self.weight = weight
        loss, nll = (loss * weight).astype(dtype, copy=False), (nll * weight).astype(dtype, copy=False)
        if self.reduction == "none":
            return loss.reshape(target_shape), nll.reshape(target_shape)
        return loss.sum(), nll.sum()

    def _fused_forward(self, flat, t, keep, smoothing, ignore_index, reduction, target_shape):
        """kernels/cross_entropy.cu: per-row loss and NLL; only the row's log-sum-exp is kept."""
        loss, nll, self.lse = kernel_ops.cross_entropy_forward(flat, t, smoothing, ignore_index)
        self.flat, self.t, self.ignore_index = flat, t, ignore_index
        self.smoothing, self.reduction = smoothing, reduction
        self.shape = tuple(target_shape) + (flat.shape[-1],)
        return self._reduce(loss, nll, keep, target_shape, flat.dtype, weight_dtype=numpy.float32)

    def _fused_backward(self, g_loss, g_nll):
        xp, rows = _xp(self.flat), len(self.t)

        def per_row(g):
            if g is None:
                return xp.zeros(rows, dtype=numpy.float32)
            g = g.reshape(-1) if self.reduction == "none" else xp.broadcast_to(g, (rows,))
            return g.astype(numpy.float32) * self.weight

        grad = kernel_ops.cross_entropy_backward(self.flat, self.t, self.lse, per_row(g_loss), per_row(g_nll),
                                                 self.smoothing, self.ignore_index)
        return grad.reshape(self.shape), None

    materialize_grads = False

    def backward(self, g_loss, g_nll):
        if self.fused:
            return self._fused_backward(g_loss, g_nll)
        xp = _xp(self.p)
        p = self.p
        vocab = p.shape[-1]
        zero = xp.zeros((), dtype=p.dtype)
        g_loss = zero if g_loss is None else g_loss
        g_nll = zero if g_nll is None else g_nll
        if self.reduction == "none":
            g_loss, g_nll = g_loss.reshape(-1, 1), g_nll.reshape(-1, 1)
        # both targets sum to one: the p part is shared. When the graph is released after this
        # backward, p is not needed again and becomes the gradient in place.
        grad = p if not self.retain_graph else p.copy()
        rows = (len(grad), 1)
        shared = xp.broadcast_to(g_loss + g_nll, rows)
        uniform = xp.broadcast_to((self.smoothing / vocab) * g_loss, rows)
        target_weight = xp.broadcast_to((1.0 - self.smoothing) * g_loss + g_nll, rows)[:, 0]

        def gradient_rows(start, stop):  # (p·(g_loss + g_nll) − q-part) · weight, rows [start, stop)
            block = grad[start:stop]
            block *= shared[start:stop]
            block[self.rows[: stop - start], self.t_safe[start:stop]] -= target_weight[start:stop]
            if self.smoothing:
                block -= uniform[start:stop]
            block *= self.weight[start:stop, None]

        backend.map_row_blocks(gradient_rows, len(grad), grad, row_size=vocab)
        return grad.reshape(self.shape), None


def _check_target(logits, target, ignore_index):
    target = target.data if isinstance(target, Tensor) else target
    if not hasattr(target, "dtype"):
        target = as_array(target, "cross_entropy: target")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"cross_entropy: target shape {tuple(target.shape)} must equal the logits' shape "
            f"without its class axis, {tuple(logits.shape[:-1])} (logits {tuple(logits.shape)})"
        )
    if target.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: target must be integer class ids, got dtype {target.dtype}")
    vocab = logits.shape[-1]
    valid = target if ignore_index is None else target[target != ignore_index]
    if valid.size and (int(valid.min()) < 0 or int(valid.max()) >= vocab):
        raise IndexError(
            f"cross_entropy: target ids must lie in [0, {vocab}) (or equal ignore_index="
            f"{ignore_index}), got values from {int(valid.min())} to {int(valid.max())}"
        )
    return backend.like(target, logits.data)


def cross_entropy(logits, target, label_smoothing=0.0, ignore_index=None, reduction="mean",
                  return_nll=False):
    """Cross entropy of ``logits`` (..., V) against integer ``target`` (...), label smoothing as in §5.4.

    ``label_smoothing`` ε spreads ε over all V classes as PyTorch does; positions
    where ``target == ignore_index`` contribute nothing and are left out of the
    mean; ``reduction`` is "mean", "sum" or "none". With ``return_nll=True`` the
    plain negative log-likelihood (for perplexity) comes back too, as
    ``(loss, nll)``, from the same softmax.
    """
    if reduction not in _REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    label_smoothing = check_real("cross_entropy: label_smoothing", label_smoothing, 0, 1)
    if logits.ndim < 1:
        raise ValueError("cross_entropy: logits need a class axis")
    if logits.dtype.kind != "f":
        raise TypeError(f"cross_entropy: logits must be floating point, got dtype {logits.dtype}")
    if logits.shape[-1] == 0:
        raise ValueError(f"cross_entropy: logits of shape {tuple(logits.shape)} have no classes")
    target = _check_target(logits, target, ignore_index)
    loss, nll = CrossEntropy.apply(logits, target, label_smoothing, ignore_index, reduction)
    return (loss, nll) if return_nll else loss


def nll_loss(logits, target, ignore_index=None, reduction="mean"):
    """Negative log-likelihood −log softmax(logits)[target] (cross entropy without smoothing)."""
    return cross_entropy(logits, target, 0.0, ignore_index, reduction)


# ------------------------------------------------------------------------ attention
def causal_mask(len_q, len_k=None, xp=numpy):
    """Keep-mask (len_q, len_k): query i sees keys j <= i + (len_k − len_q).

    Queries are aligned with the *last* keys, so with a cache of earlier keys a
    new query sees everything before it and itself.
    """
    len_k = len_q if len_k is None else len_k
    return xp.tril(xp.ones((len_q, len_k), dtype=bool), k=len_k - len_q)


class ScaledDotProductAttention(Function):
    """O = softmax(QKᵀ/√d_k + mask) V (§3.2.1), one node for the whole block.

    Backward, with P the probabilities (D the dropout mask scaled by 1/(1−p), P̃ = P∘D):
    dV = P̃ᵀ·dO, dP = (dO·Vᵀ)∘D, dS = P∘(dP − rowsum(dP∘P)), dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k.
    A query whose keys are all masked has P = 0: zero output and zero gradient.

    On NumPy arrays whose batch axis q, k, v (and a mask with a batch axis) share, each step
    runs over blocks of the batch on several threads (``map_row_blocks``): every formula
    above is per batch entry. The dropout mask is drawn first, for the whole P, in order.
    """

    def forward(self, q, k, v, mask, dropout_p, generator):
        xp = _xp(q, k, v)
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        self.keep = None
        self.drop_scale = xp.result_type(q, k, v).type(1.0 / (1.0 - dropout_p)) if dropout_p else None
        self.q, self.k, self.v = q, k, v
        self.blocks = _batch_blocks(xp, q, k, v, mask)
        if self.blocks:
            return self._forward_blocks(q, k, v, mask, dropout_p, generator)
        p = self._probabilities(xp, q, k, mask)
        p_used, self.keep = _dropped(p, dropout_p, generator) if dropout_p else (p, None)
        self.p, self.p_used = p, p_used
        return _matmul_in_layout_of(q, p_used, v), p

    def _probabilities(self, xp, q, k, mask, out=None):
        """P = softmax(QKᵀ/√d_k) with masked scores at −∞, made in place in ``out`` if given."""
        scores = xp.matmul(q, k.swapaxes(-1, -2), out=out)
        scores *= scores.dtype.type(self.scale)
        if mask is not None:
            full = numpy.broadcast_shapes(scores.shape, mask.shape)
            if scores.shape != full:  # a mask with more batch/head entries than q and k
                scores = xp.broadcast_to(scores, full).copy()
            xp.copyto(scores, -xp.inf, where=~mask)
        row_max = scores.max(axis=-1, keepdims=True)
        row_max[~xp.isfinite(row_max)] = 0  # a fully masked row: exp(−inf − 0) = 0
        scores -= row_max
        p = xp.exp(scores, out=scores)  # scores becomes the probabilities, in place
        total = p.sum(axis=-1, keepdims=True)
        total[total == 0] = 1
        p /= total
        return p

    def _forward_blocks(self, q, k, v, mask, dropout_p, generator):
        batch, heads, len_q, len_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        dtype = numpy.result_type(q, k, v)
        self.p = p = numpy.empty((batch, heads, len_q, len_k), dtype=dtype)
        if dropout_p:
            self.keep = _keep_mask_on_cpu(p.shape, dropout_p, generator)
            self.p_used = p_used = numpy.empty_like(p)
        else:
            self.p_used = p_used = p
        out = _empty_in_layout_of(q, q.shape[:-1] + v.shape[-1:], dtype)

        def rows(start, stop):
            part = slice(start, stop)
            batch_mask = mask[part] if mask is not None and mask.ndim == 4 and mask.shape[0] > 1 else mask
            self._probabilities(numpy, q[part], k[part], batch_mask, out=p[part])
            if dropout_p:
                numpy.multiply(p[part], self.keep[part], out=p_used[part])
                p_used[part] *= self.drop_scale
            numpy.matmul(p_used[part], v[part], out=out[part])

        backend.map_row_blocks(rows, batch, p, row_size=p[0].size)
        return out, p

    materialize_grads = False

    def backward(self, g_out, g_weights):
        q, k, v, p = self.q, self.k, self.v, self.p
        xp = _xp(p)
        if g_out is None:
            g_out = xp.zeros(p.shape[:-1] + v.shape[-1:], dtype=p.dtype)
        need_q, need_k, need_v = self.needs_input_grad[:3]
        if self.blocks:
            grads = [_empty_in_layout_of(a, a.shape, p.dtype) if need else None
                     for a, need in ((q, need_q), (k, need_k), (v, need_v))]

            def rows(start, stop):
                part = slice(start, stop)
                self._gradients(g_out[part], None if g_weights is None else g_weights[part], part,
                                *[None if g is None else g[part] for g in grads])

            backend.map_row_blocks(rows, p.shape[0], p, row_size=p[0].size)
            return (*grads, None)
        grad_q, grad_k, grad_v = self._gradients(g_out, g_weights, slice(None), None, None, None)
        return (
            None if grad_q is None else sum_to_shape(grad_q, q.shape),
            None if grad_k is None else sum_to_shape(grad_k, k.shape),
            None if grad_v is None else sum_to_shape(grad_v, v.shape),
            None,
        )

    def _gradients(self, g_out, g_weights, part, out_q, out_k, out_v):
        """dQ, dK, dV of the batch entries ``part`` (written into ``out_*`` when given)."""
        q, k, v, p, p_used = self.q[part], self.k[part], self.v[part], self.p[part], self.p_used[part]
        need_q, need_k, need_v = self.needs_input_grad[:3]
        grad_q = grad_k = grad_v = None
        if need_v:
            grad_v = _matmul_in_layout_of(v, p_used.swapaxes(-1, -2), g_out, out_v)
        if need_q or need_k:
            dp = g_out @ v.swapaxes(-1, -2)
            if self.keep is not None:
                dp *= self.keep[part]
                dp *= self.drop_scale
            if g_weights is not None:
                dp = dp + g_weights
            dp -= (dp * p).sum(axis=-1, keepdims=True)
            dp *= p
            dp *= dp.dtype.type(self.scale)
            if need_q:
                grad_q = _matmul_in_layout_of(q, dp, k, out_q)
            if need_k:
                grad_k = _matmul_in_layout_of(k, dp.swapaxes(-1, -2), q, out_k)
        return grad_q, grad_k, grad_v


def _batch_blocks(xp, q, k, v, mask):
    """Whether attention can run in batch blocks: NumPy, the (batch, heads) axes shared by q, k
    and v, a mask with that batch axis or broadcast over it, and no mask axis wider than the scores."""
    batch = q.shape[0]
    if xp is not numpy or q.ndim != 4 or batch < 2 or not q.shape[:2] == k.shape[:2] == v.shape[:2]:
        return False
    if mask is None:
        return True
    scores = q.shape[:-1] + k.shape[-2:-1]
    return ((mask.ndim < 4 or mask.shape[0] in (1, batch))
            and numpy.broadcast_shapes(scores, mask.shape) == scores)


def _keep_mask_on_cpu(shape, p, generator):
    """keep = [u ≥ p] for one ``generator.random(shape, float32)`` draw, drawn in blocks."""
    keep = numpy.empty(shape, dtype=bool)
    flat = keep.reshape(-1)
    uniform_blocks(generator, flat.size, lambda start, stop, samples: numpy.greater_equal(
        samples, p, out=flat[start:stop]))
    return keep


def _empty_in_layout_of(like, shape, dtype):
    """An empty (batch, heads, len, d) array laid out as ``like`` is when ``like`` is a view of a
    (batch, len, heads, d) array (heads split off by reshape and transpose, as in
    MultiHeadAttention): merging the heads back, or the split's backward, is then a free
    reshape instead of a copy. Otherwise a C-contiguous one."""
    if like.ndim == 4 and like.transpose(0, 2, 1, 3).flags.c_contiguous and not like.flags.c_contiguous:
        return numpy.empty((shape[0], shape[2], shape[1], shape[3]), dtype=dtype).transpose(0, 2, 1, 3)
    return numpy.empty(shape, dtype=dtype)


def _matmul_in_layout_of(like, a, b, out=None):
    """a @ b into ``out`` when given, else a new array in ``like``'s memory layout (see
    ``_empty_in_layout_of``); plain ``a @ b`` on CuPy or when the shapes differ."""
    if out is not None:
        return numpy.matmul(a, b, out=out)
    shape = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if _xp(a, b) is not numpy or like.ndim != 4 or shape != like.shape:
        return a @ b
    return numpy.matmul(a, b, out=_empty_in_layout_of(like, shape, numpy.result_type(a, b)))


class FusedAttention(Function):
    """The attention above through kernels/attention.cu (FlashAttention-style), CuPy only.

    Forward keeps O and the row log-sum-exp L = log Σⱼ exp(sᵢⱼ), never P; backward
    recomputes P = exp(QKᵀ/√d_k − L) tile by tile with the same formulas as above and
    Δ = rowsum(dO∘O) in place of rowsum(dP∘P) (they are equal). Masks are per-sequence
    key lengths and the causal flag; the dropout mask comes from Philox(seed), drawn
    from ``generator``, and is regenerated in backward.
    """

    def forward(self, q, k, v, key_lengths, causal, dropout_p, generator):
        batch, heads, len_q, dim = q.shape
        len_k = k.shape[2]
        self.seed = int((generator or default_generator()).integers(2 ** 63)) if dropout_p else 0
        self.q, self.k, self.v = (a.reshape(batch * heads, -1, dim) for a in (q, k, v))
        self.args = dict(heads=heads, key_lengths=key_lengths, causal=causal, dropout_p=dropout_p, seed=self.seed)
        self.o, self.lse = kernel_ops.attention_forward(self.q, self.k, self.v, **self.args)
        self.shapes = (q.shape, (batch, heads, len_k, dim))
        return self.o.reshape(batch, heads, len_q, dim)

    def backward(self, g):
        g = g.reshape(self.o.shape).astype(self.o.dtype, copy=False)
        grad_q, grad_k, grad_v = kernel_ops.attention_backward(self.q, self.k, self.v, self.o, self.lse, g,
                                                               **self.args)
        q_shape, kv_shape = self.shapes
        return grad_q.reshape(q_shape), grad_k.reshape(kv_shape), grad_v.reshape(kv_shape), None


def _fused_attention_lengths(q, k, v, mask, return_weights):
    """``(True, key lengths or None)`` when FusedAttention can run this call, else ``(False, None)``.

    The kernel takes (batch, heads, len, d_k) tensors of one dtype, d_k in HEAD_DIMS,
    and a mask that only hides trailing padded keys (shape (batch, 1, 1, len_k), as
    ``padding_mask`` builds). Anything else, and ``return_weights``, takes the reference.
    """
    if return_weights or not _use_kernel(q.data, k.data, v.data):
        return False, None
    if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[-1] not in HEAD_DIMS:
        return False, None
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        return False, None
    if mask is None:
        return True, None
    mask = mask.data if isinstance(mask, Tensor) else mask
    batch, len_k = q.shape[0], k.shape[2]
    if getattr(mask, "dtype", None) != bool or tuple(mask.shape) != (batch, 1, 1, len_k):
        return False, None
    xp = _xp(q.data)
    keep = backend.like(mask, q.data)[:, 0, 0, :]
    lengths = keep.sum(axis=-1)
    if not bool((keep == (xp.arange(len_k)[None, :] < lengths[:, None])).all()):
        return False, None  # holes in the mask: not a key-length mask
    return True, lengths.astype(numpy.int32)


def _attention_mask(mask, causal, q, k):
    """The boolean keep-mask for scores of shape (..., len_q, len_k), or None."""
    len_q, len_k = q.shape[-2], k.shape[-2]
    scores_shape = numpy.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (len_q, len_k)
    if mask is not None:
        mask = mask.data if isinstance(mask, Tensor) else mask
        if not hasattr(mask, "dtype"):
            mask = as_array(mask, "attention mask")
        if mask.dtype != bool:
            raise TypeError(
                f"attention mask must be boolean (True = attend), got dtype {mask.dtype}"
            )
        try:
            if numpy.broadcast_shapes(mask.shape, scores_shape) != scores_shape:
                raise ValueError
        except ValueError:
            raise ValueError(
                f"attention mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
                f"shape {scores_shape} (batch, heads, len_q, len_k)"
            ) from None
        mask = backend.like(mask, q.data)
    if causal:
        xp = _xp(q.data)
        future = causal_mask(len_q, len_k, xp)
        mask = future if mask is None else mask & future
    return mask


def scaled_dot_product_attention(q, k, v, mask=None, causal=False, dropout_p=0.0,
                                 return_weights=False, generator=None):
    """softmax(QKᵀ/√d_k)V on (batch, heads, len, d_k) tensors (§3.2.1).

    ``mask`` is a boolean keep-mask (True = attend) broadcastable to
    (batch, heads, len_q, len_k); ``causal=True`` also hides later keys.
    ``dropout_p`` drops attention probabilities (training only: pass 0 in eval).
    With ``return_weights=True`` returns ``(output, probabilities)``; the
    probabilities are those before dropout.
    """
    dropout_p = check_probability("scaled_dot_product_attention: dropout_p", dropout_p)
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"scaled_dot_product_attention: q, k, v must have the same rank >= 2, got shapes "
            f"{q.shape}, {k.shape}, {v.shape}"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"scaled_dot_product_attention: q {q.shape} and k {k.shape} need the same d_k, and "
            f"k and v {v.shape} the same number of keys"
        )
    try:
        numpy.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"scaled_dot_product_attention: the batch axes of q {q.shape}, k {k.shape} and v {v.shape} "
            "(all but the last two) do not broadcast"
        ) from None
    if dropout_p:
        _check_generator(generator, "scaled_dot_product_attention: generator")
    fused, key_lengths = _fused_attention_lengths(q, k, v, mask, return_weights)
    if fused:
        return FusedAttention.apply(q, k, v, key_lengths, bool(causal), float(dropout_p), generator)
    mask = _attention_mask(mask, causal, q, k)
    out, weights = ScaledDotProductAttention.apply(q, k, v, mask, float(dropout_p), generator)
    return (out, weights) if return_weights else out


def padding_mask(ids, pad_id):
    """Keep-mask (batch, 1, 1, len) that hides the keys where ``ids == pad_id``."""
    ids = ids.data if isinstance(ids, Tensor) else ids
    if not hasattr(ids, "ndim"):
        ids = numpy.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"padding_mask: ids must be (batch, len), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]


def sinusoid_table(max_len, d_model, dtype=numpy.float32):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...) (§3.5)."""
    max_len = check_int("sinusoid_table: max_len", max_len, 1)
    d_model = check_int("sinusoid_table: d_model", d_model, 1)
    position = numpy.arange(max_len, dtype=numpy.float64)[:, None]
    rate = numpy.exp(-math.log(10000.0) * numpy.arange(0, d_model, 2) / d_model)
    table = numpy.zeros((max_len, d_model))
    table[:, 0::2] = numpy.sin(position * rate)
    table[:, 1::2] = numpy.cos(position * rate[: d_model // 2])
    return table.astype(dtype)
