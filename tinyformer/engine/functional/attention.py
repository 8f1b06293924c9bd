"""Scaled dot-product attention (§3.2.1), one node for the whole block; on the GPU
kernels/attention_mma.cu (tensor cores) for float16/bfloat16 on sm_80+, and kernels/attention.cu
for float32 and for float16 on sm_70/75 (``kernels.paths.attention_path``)."""

import math

import numpy

from .. import amp, backend, kernels
from ..kernels import attention as attention_kernel
from ..kernels.cublas import matmul
from ..kernels import paths
from ..ops._helpers import sum_to_shape
from ..tensor import Tensor
from ...common.validation import check_probability, rectangular_array
from ._dispatch import KernelFunction
from ..random import kernel_seed
from .dropout import _check_generator, _dropped, _keep_mask_on_cpu
from .masks import KeyLengthMask, causal_mask

_xp = backend.get_array_module


class ScaledDotProductAttention(KernelFunction):
    """O = softmax(QKᵀ/√d_k + mask) V (§3.2.1), one node for the whole block.

    Backward, with P the probabilities (D the dropout mask scaled by 1/(1−p), P̃ = P∘D):
    dV = P̃ᵀ·dO, dP = (dO·Vᵀ)∘D, dS = P∘(dP − rowsum(dP∘P)), dQ = dS·K/√d_k, dK = dSᵀ·Q/√d_k.
    A query whose keys are all masked has P = 0: zero output and zero gradient. The outputs are
    O, and P (before dropout) as a second output when ``return_weights``.

    On NumPy arrays whose batch axis q, k, v (and a mask with a batch axis) share, each step
    runs over blocks of the batch on several threads (``map_row_blocks``): every formula
    above is per batch entry. The dropout mask is drawn first, for the whole P, in order.

    The kernel path keeps O and the row log-sum-exp L = log Σⱼ exp(sᵢⱼ), never P; its backward
    recomputes P = exp(QKᵀ/√d_k − L) tile by tile with the same formulas and Δ = rowsum(dO∘O) in
    place of rowsum(dP∘P) (they are equal). It takes masks as per-sequence key lengths and the
    causal flag; its dropout mask comes from Philox(seed), drawn from ``generator``, and is
    regenerated in backward. The path is ``kernels.paths.attention_path`` of the device's capability:
    float16/bfloat16 on sm_80+ run on tensor cores (kernels/attention_mma.cu, FlashAttention-2), reading q, k, v where the head split left them and writing O (and the
    gradients) as views of (batch, len, heads, d) arrays, so that merging the heads is free;
    float32, and float16 on sm_70/75, the CUDA-core kernel (kernels/attention.cu) on (batch·heads, len,
    d) copies; bfloat16 below sm_80 is refused in one line naming the device.
    """

    materialize_grads = False

    def kernel_applies(self, q, k, v, mask, causal, dropout_p, generator, return_weights):
        """The kernel takes what its launcher takes (``kernels.attention.input_problem``:
        (batch, heads, len, d_k) arrays of one dtype, d_k one it has), no mask or one that only
        hides trailing padded keys (``padding_mask``'s (batch, 1, 1, len_k)), and returns no
        weights; anything else takes the reference."""
        if return_weights or not kernels.use_kernels(q, k, v):
            return False
        if attention_kernel.input_problem(q, k, v) is not None:
            return False
        fits, self.key_lengths = _key_lengths_of_mask(mask, q.shape[0], k.shape[2])  # forward_kernel passes them on
        capability = paths.device_capability()
        self.path = paths.attention_path(capability, q.dtype.name, q.shape[-1], fits=fits)
        if self.path.name == "refused":  # bfloat16 below sm_80: before any launch, naming the device
            raise RuntimeError(paths.precision_problem(capability, q.dtype.name, backend.device_name()))
        return self.path.name != "reference"

    # ---------------------------------------------------------------- the NumPy reference
    def forward_reference(self, q, k, v, mask, causal, dropout_p, generator, return_weights):
        xp = _xp(q, k, v)
        mask = mask.mask if isinstance(mask, KeyLengthMask) else mask
        if causal:
            future = causal_mask(q.shape[-2], k.shape[-2], xp)
            mask = future if mask is None else mask & future
        self.scale = 1.0 / math.sqrt(q.shape[-1])
        self.keep = None
        self.drop_scale = xp.result_type(q, k, v).type(1.0 / (1.0 - dropout_p)) if dropout_p else None
        self.q, self.k, self.v = q, k, v
        self.blocks = _batch_blocks(xp, q, k, v, mask)
        if self.blocks:
            out, p = self._forward_blocks(q, k, v, mask, dropout_p, generator)
        else:
            p = self._probabilities(xp, q, k, mask)
            p_used, self.keep = _dropped(p, dropout_p, generator) if dropout_p else (p, None)
            self.p, self.p_used = p, p_used
            out = _matmul_in_layout_of(q, p_used, v)
        return (out, p) if return_weights else out

    def _probabilities(self, xp, q, k, mask, out=None):
        """P = softmax(QKᵀ/√d_k) with masked scores at −∞, made in place in ``out`` if given."""
        scores = matmul(q, k.swapaxes(-1, -2), out=out)
        scores *= scores.dtype.type(self.scale)
        if mask is not None:
            full = numpy.broadcast_shapes(scores.shape, mask.shape)
            if scores.shape != full:  # a mask with more batch/head entries than q and k
                scores = xp.broadcast_to(scores, full).copy()
            xp.copyto(scores, -xp.inf, where=~mask)
        row_max = scores.max(axis=-1, keepdims=True)
        # a fully masked row: exp(−inf − 0) = 0 (copyto with where: no boolean indexing, which on CuPy
        # reads the mask's count to the host and so cannot be captured into a CUDA graph)
        xp.copyto(row_max, 0, where=~xp.isfinite(row_max))
        scores -= row_max
        p = xp.exp(scores, out=scores)  # scores becomes the probabilities, in place
        total = p.sum(axis=-1, keepdims=True)
        xp.copyto(total, 1, where=total == 0)
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

    def backward_reference(self, g_out, g_weights=None):
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
            dp = matmul(g_out, v.swapaxes(-1, -2))
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

    # ---------------------------------------------------------------- the CUDA kernel
    def forward_kernel(self, q, k, v, mask, causal, dropout_p, generator, return_weights):
        self.seed = kernel_seed(generator) if dropout_p else 0
        tensor_cores = self.path.name == "tensor cores"  # paths.attention_path's choice
        # both read the heads where the projections left them and write o (and, backward, the
        # gradients) in the projections' layout: no copy either way
        self.forward_launcher, self.backward_launcher = (
            (attention_kernel.attention_mma_forward, attention_kernel.attention_mma_backward) if tensor_cores
            else (attention_kernel.attention_heads_forward, attention_kernel.attention_heads_backward))
        self.q, self.k, self.v = q, k, v
        self.args = dict(key_lengths=self.key_lengths, causal=causal, dropout_p=dropout_p, seed=self.seed)
        self.o, self.lse = self.forward_launcher(q, k, v, **self.args)
        return self.o

    def backward_kernel(self, g):
        return (*self.backward_launcher(self.q, self.k, self.v, self.o, self.lse, g, **self.args), None)


def _key_lengths_of_mask(mask, batch, len_k):
    """``(True, per-sequence key counts or None)`` when ``mask`` is none or only hides trailing
    keys (shape (batch, 1, 1, len_k), as ``padding_mask`` builds), else ``(False, None)``."""
    if mask is None:
        return True, None
    if tuple(mask.shape) != (batch, 1, 1, len_k):
        return False, None
    if isinstance(mask, KeyLengthMask):
        return True, mask.lengths  # known by construction: nothing to check or read back
    keep = mask[:, 0, 0, :]
    lengths = keep.sum(axis=-1)
    if not bool((keep == (_xp(mask).arange(len_k)[None, :] < lengths[:, None])).all()):
        return False, None  # holes in the mask: not a key-length mask
    return True, lengths.astype(numpy.int32)


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
    ``_empty_in_layout_of``); a new C-ordered array on CuPy or when the shapes differ. (On CuPy
    every product is ``kernels.cublas.matmul``'s: capturable into a CUDA graph.)"""
    if out is not None:
        return matmul(a, b, out=out)
    shape = numpy.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if _xp(a, b) is not numpy or like.ndim != 4 or shape != like.shape:
        return matmul(a, b)
    return numpy.matmul(a, b, out=_empty_in_layout_of(like, shape, numpy.result_type(a, b)))


def _checked_mask(mask, q, k):
    """The boolean keep-mask as an array on q's device, checked to broadcast to the scores'
    shape (..., len_q, len_k); or None."""
    if mask is None:
        return None
    scores_shape = numpy.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (q.shape[-2], k.shape[-2])
    if isinstance(mask, KeyLengthMask):
        _check_broadcast(mask, scores_shape)
        if backend.is_cupy_array(mask.lengths) != backend.is_cupy_array(q.data):
            raise ValueError("attention mask: a KeyLengthMask must live on the device of q (make it from lengths "
                             "on that device)")
        return mask
    mask = mask.data if isinstance(mask, Tensor) else mask
    if not hasattr(mask, "dtype"):
        mask = rectangular_array(mask, "attention mask")
    if mask.dtype != bool:
        raise TypeError(
            f"attention mask must be boolean (True = attend), got dtype {mask.dtype}"
        )
    _check_broadcast(mask, scores_shape)
    return backend.like(mask, q.data)


def _check_broadcast(mask, scores_shape):
    try:
        if numpy.broadcast_shapes(mask.shape, scores_shape) != scores_shape:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"attention mask of shape {tuple(mask.shape)} does not broadcast to the scores' "
            f"shape {scores_shape} (batch, heads, len_q, len_k)"
        ) from None


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
    q, k, v = amp.half_args(q, k, v)
    return ScaledDotProductAttention.apply(q, k, v, _checked_mask(mask, q, k), bool(causal), float(dropout_p),
                                           generator, bool(return_weights))
