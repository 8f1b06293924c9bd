"""The launchers of attention.cu (CUDA cores, float32) and attention_mma.cu (tensor cores,
float16 and bfloat16): fused scaled dot-product attention, forward and backward, keeping the row
log-sum-exp instead of the probabilities (FlashAttention-2).

Reference: ``functional.ScaledDotProductAttention``. What the kernels take is stated once,
here (``input_problem``): the launchers raise it and the functional op asks it before it picks
its kernel path. Block sizes, tiles and dynamic shared memory come from ``registry``
(``attention_rows_per_block``, ``mma_attention_*``); the kernels, their template parameters
and element types (``registry.MMA_DTYPES`` for attention_mma.cu) are registered in
``registry.KERNELS``.
"""

import math

import numpy

from .. import backend
from . import launch, registry
from .arguments import array_module, contiguous, element_dtype, f32, i32, pointer, seed_arguments


def input_problem(q, k, v, split_heads=True):
    """Why the attention kernels cannot take q, k, v, as the exception to raise; None when they can.

    They take arrays of one dtype shaped (batch, heads, len, head_dim) (``split_heads``: the
    tensor-core kernels, and the functional op's arrays) or (batch·heads, len, head_dim) (the
    CUDA-core kernels), k and v of one shape, q sharing their leading axes and their head_dim,
    which must be one of ``registry.HEAD_DIMS``.
    """
    layout = "(batch, heads, len, head_dim)" if split_heads else "(batch·heads, len, head_dim)"
    if not q.ndim == k.ndim == v.ndim == (4 if split_heads else 3):
        return ValueError(f"attention kernel: q, k, v must be {layout}, got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        return ValueError(f"attention kernel: shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[-1] not in registry.HEAD_DIMS:
        return ValueError(f"attention kernel: head dimension {q.shape[-1]} is not supported "
                          f"(supported: {registry.HEAD_DIMS})")
    if not q.dtype == k.dtype == v.dtype:
        return TypeError(f"attention kernel: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return None


def _check_inputs(q, k, v, split_heads):
    problem = input_problem(q, k, v, split_heads)
    if problem is not None:
        raise problem


def _key_lengths_argument(key_lengths, batch, xp):
    """The kernels' ``key_lengths`` argument: an int32 array of per-sequence key counts, or a null
    pointer (every key visible)."""
    if key_lengths is None:
        return numpy.uint64(0)  # NULL for `const int*`
    lengths = xp.ascontiguousarray(key_lengths, dtype=numpy.int32)
    if lengths.shape != (batch,):
        raise ValueError(f"attention kernel: key_lengths must have shape ({batch},), got {tuple(lengths.shape)}")
    return lengths


# ------------------------------------------------------------------------ CUDA cores: attention.cu
def _cost(products, q, k, causal, arrays, compute):
    """(bytes, FLOPs, compute) of one attention launch for ``launch``'s count: ``products`` matrix
    products of (len_q × head_dim) by (head_dim × len_k) size per head (the forward 2: S = QKᵀ, PV;
    dQ's kernel 3: S again, dP, dS·K; dK/dV's 4: S, dV, dP, dK), half of them where causal, and the
    bytes of ``arrays``, what the launch reads and writes (each once)."""
    rows, len_k, dim = q.size // q.shape[-1], k.shape[-2], q.shape[-1]
    flops = 2 * products * rows * len_k * dim // (2 if causal else 1)
    return sum(a.nbytes for a in arrays if a is not None), flops, compute


def attention_forward(q, k, v, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                      dtype=None):
    """Fused attention on (batch·heads, len, head_dim) arrays; returns (o, lse), o of q's shape."""
    _check_inputs(q, k, v, split_heads=False)
    q, k, v = contiguous(q, k, v)
    o = array_module(q).empty_like(q)
    lse = _forward(*(_by_heads(a, heads) for a in (q, k, v, o)), key_lengths, causal, scale, dropout_p, seed, offset,
                   element_dtype(q, dtype))
    return o, lse


def attention_heads_forward(q, k, v, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                            dtype=None):
    """Fused attention on CUDA cores for q, k, v of shape (batch, heads, len, head_dim) with any
    strides whose head dimension is contiguous (the views a head split by reshape and transpose
    makes, read where they are). Returns (o, lse): o (batch, heads, len_q, head_dim) as a view of a
    (batch, len_q, heads, head_dim) array (the output projection's layout), lse (batch·heads, len_q)."""
    _check_inputs(q, k, v, split_heads=True)
    q, k, v = (_rows_contiguous(a) for a in (q, k, v))
    batch, heads, len_q, dim = q.shape
    o = _projection_empty(array_module(q), batch, heads, len_q, dim, q.dtype)
    return o, _forward(q, k, v, o, key_lengths, causal, scale, dropout_p, seed, offset, element_dtype(q, dtype))


def _by_heads(array, heads):
    """A (batch·heads, len, d) array as its (batch, heads, len, d) view."""
    return array.reshape(array.shape[0] // heads, heads, *array.shape[1:])


def _rows_contiguous(array):
    """``array`` (batch, heads, len, d) itself when its head dimension is contiguous, else in the projection layout."""
    return array if array.strides[3] == array.itemsize or array.shape[3] == 1 else projection_layout(array)


def _strides(array):
    """The (batch, head, row) strides in elements of a (batch, heads, len, d) view, as the kernels take them."""
    return [numpy.int64(s // array.itemsize) for s in array.strides[:3]]


def _forward(q, k, v, o, key_lengths, causal, scale, dropout_p, seed, offset, name):
    """attention.cu's forward on (batch, heads, len, d) views, o written where its view says; returns lse."""
    xp = array_module(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    lse = xp.empty((batch * heads, len_q), dtype=numpy.float32)
    lengths = _key_lengths_argument(key_lengths, batch, xp)
    if batch * heads and len_q:
        rows = registry.attention_rows_per_block(dim)
        launch.launch("attention_forward", name, (batch * heads, math.ceil(len_q / rows)),
                      (registry.attention_threads(),),
                      (*(numpy.uint64(pointer(a)) for a in (q, k, v, o)), lse, lengths,
                       *_strides(q), *_strides(k), *_strides(v), *_strides(o), i32(heads), i32(len_q), i32(len_k),
                       i32(causal), f32(scale), f32(dropout_p), *seed_arguments(seed, q), numpy.uint64(offset)),
                      head_dim=dim, cost=_cost(2, q, k, causal, (q, k, v, o, lse), "fp32"))
    return lse


def attention_backward(q, k, v, o, lse, grad_o, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                       seed=0, offset=0, dtype=None):
    """Returns (grad_q, grad_k, grad_v) of (batch·heads, len, head_dim) arrays, recomputing the
    probabilities from ``lse``."""
    _check_inputs(q, k, v, split_heads=False)
    q, k, v, o, grad_o = contiguous(q, k, v, o, grad_o)
    xp = array_module(q)
    grads = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    _backward(*(_by_heads(a, heads) for a in (q, k, v, o, grad_o)), lse, *(_by_heads(g, heads) for g in grads),
              key_lengths, causal, scale, dropout_p, seed, offset, element_dtype(q, dtype))
    return grads


def attention_heads_backward(q, k, v, o, lse, grad_o, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                             seed=0, offset=0, dtype=None):
    """(grad_q, grad_k, grad_v) of ``attention_heads_forward``, each (batch, heads, len, head_dim) as a
    view of a (batch, len, heads, head_dim) array, or side by side as q, k and v are
    (``gradient_buffers``); ``grad_o`` is copied to o's layout if it is not in it."""
    _check_inputs(q, k, v, split_heads=True)
    q, k, v = (_rows_contiguous(a) for a in (q, k, v))
    o, grad_o = projection_layout(o), projection_layout(grad_o.astype(q.dtype, copy=False))
    grad_q, grad_k, grad_v = gradient_buffers(q, k, v)
    _backward(q, k, v, o, grad_o, lse, grad_q, grad_k, grad_v, key_lengths, causal, scale, dropout_p, seed, offset,
              element_dtype(q, dtype))
    return grad_q, grad_k, grad_v


def _backward(q, k, v, o, grad_o, lse, grad_q, grad_k, grad_v, key_lengths, causal, scale, dropout_p, seed, offset,
              name):
    """attention.cu's backward on (batch, heads, len, d) views; o and grad_o views of one contiguous
    layout (delta follows o's rows), the gradients written where their views say."""
    xp = array_module(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    lengths = _key_lengths_argument(key_lengths, batch, xp)
    delta = xp.empty(batch * heads * len_q, dtype=numpy.float32)  # by o's rows
    rows, threads = registry.attention_rows_per_block(dim), registry.attention_threads()
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(o))
    tail = (i32(heads), i32(len_q), i32(len_k), i32(causal), f32(scale), f32(dropout_p), *seed_arguments(seed, q),
            numpy.uint64(offset))
    operands = tuple(numpy.uint64(pointer(a)) for a in (q, k, v, grad_o))
    if batch * heads and len_q:
        delta_blocks = math.ceil(delta.size / registry.ATTENTION_WARPS)  # one warp per row
        launch.launch("attention_backward_delta", name, (delta_blocks,), (threads,),
                      (numpy.uint64(pointer(o)), numpy.uint64(pointer(grad_o)), delta, numpy.int64(delta.size)),
                      head_dim=dim)
        launch.launch("attention_backward_q", name, (batch * heads, math.ceil(len_q / rows)), (threads,),
                      (*operands, lse, delta, numpy.uint64(pointer(grad_q)), lengths, *strides, *_strides(grad_q),
                       *tail), head_dim=dim,
                      cost=_cost(3, q, k, causal, (q, k, v, grad_o, lse, delta, grad_q), "fp32"))
    if batch * heads and len_k:
        launch.launch("attention_backward_kv", name, (batch * heads, math.ceil(len_k / rows)), (threads,),
                      (*operands, lse, delta, numpy.uint64(pointer(grad_k)), numpy.uint64(pointer(grad_v)), lengths,
                       *strides, *_strides(grad_k), *_strides(grad_v), *tail), head_dim=dim,
                      cost=_cost(4, q, k, causal, (q, k, v, grad_o, lse, delta, grad_k, grad_v), "fp32"))


# ------------------------------------------------------------------------ tensor cores: attention_mma.cu
def _readable_in_place(array):
    """Whether the kernel can read ``array`` (batch, heads, len, d) where it is: the head dimension
    contiguous, the other strides whole 16-byte chunks, the data 16-byte aligned (cp.async)."""
    item = array.itemsize
    strides = array.strides
    return (strides[3] == item or array.shape[3] == 1) and all(
        s % 16 == 0 for s, n in zip(strides[:3], array.shape[:3]) if n > 1) and pointer(array) % 16 == 0


def projection_layout(array):
    """``array`` (batch, heads, len, d) as a view of a C-contiguous (batch, len, heads, d) array
    (the layout the Q/K/V projections produce and the output projection reads): the array itself
    when it is one, else a copy."""
    xp = array_module(array)
    merged = array.transpose(0, 2, 1, 3)
    if merged.flags.c_contiguous:
        return array
    backend.note_launch("copy (to C order)", bytes=2 * array.nbytes)
    return xp.ascontiguousarray(merged).transpose(0, 2, 1, 3)


def _strided(array):
    """(pointer, batch, head, row strides in elements) of a (batch, heads, len, d) operand, copied
    to the projection layout first when the kernel cannot read it in place."""
    if not _readable_in_place(array):
        array = projection_layout(array)
    strides = [numpy.int64(s // array.itemsize) for s in array.strides[:3]]
    return array, [numpy.uint64(pointer(array)), *strides]


def _projection_empty(xp, batch, heads, length, dim, dtype):
    return xp.empty((batch, length, heads, dim), dtype=dtype).transpose(0, 2, 1, 3)


def _side_by_side(arrays):
    """Whether (batch, heads, len, d) views are the column blocks, in order, of one (batch, len,
    n·heads·d) product (``F.linear_parts``' Q, K and V, or K and V)."""
    first = arrays[0]
    batch, heads, length, dim = first.shape
    item, width = first.itemsize, len(arrays) * heads * dim
    if first.strides != (length * width * item, dim * item, width * item, item):
        return False
    return all(a.shape == first.shape and a.dtype == first.dtype and a.strides == first.strides
               and pointer(a) == pointer(first) + i * heads * dim * item for i, a in enumerate(arrays))


def gradient_buffers(q, k, v):
    """Empty (grad_q, grad_k, grad_v) laid out as q, k and v are: side by side in one buffer where they
    are (so that the product that made them reads their gradients as one matrix, no copy), else each
    in the projection layout."""
    xp = array_module(q)

    def side_by_side(arrays):
        batch, heads, length, dim = arrays[0].shape
        joint = xp.empty((batch, length, len(arrays) * heads * dim), dtype=arrays[0].dtype)
        return [joint[:, :, i * heads * dim:(i + 1) * heads * dim].reshape(batch, length, heads, dim)
                .transpose(0, 2, 1, 3) for i in range(len(arrays))]

    if _side_by_side([q, k, v]):
        return tuple(side_by_side([q, k, v]))
    batch, heads, len_q, dim = q.shape
    grad_q = _projection_empty(xp, batch, heads, len_q, dim, q.dtype)
    if _side_by_side([k, v]):
        return (grad_q, *side_by_side([k, v]))
    return (grad_q, *(_projection_empty(xp, batch, heads, k.shape[2], dim, q.dtype) for _ in range(2)))


def _row_stride(array):
    """The elements between one position's row of a (batch, heads, len, d) gradient view and the next."""
    return numpy.int64(array.strides[2] // array.itemsize)


def attention_mma_forward(q, k, v, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                          dtype=None):
    """Fused attention on tensor cores (attention_mma.cu) for float16 or bfloat16 q, k, v of shape
    (batch, heads, len, head_dim) with any strides (read in place when 16-byte aligned, the
    layout of a head split by reshape and transpose). Returns (o, lse): o (batch, heads, len_q,
    head_dim) as a view of a (batch, len_q, heads, head_dim) array, lse (batch·heads, len_q) float32."""
    _check_inputs(q, k, v, split_heads=True)
    name = element_dtype(q, dtype)
    registry.name_expression("attention_mma_forward", name, q.shape[3])  # a clear error for float32
    xp = array_module(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    o = _projection_empty(xp, batch, heads, len_q, dim, q.dtype)
    lse = xp.empty((batch * heads, len_q), dtype=numpy.float32)
    lengths = _key_lengths_argument(key_lengths, batch, xp)
    if batch * heads and len_q:
        (q, q_args), (k, k_args), (v, v_args) = _strided(q), _strided(k), _strided(v)
        kernel = "attention_mma_forward"
        launch.launch(kernel, name, (batch * heads, math.ceil(len_q / registry.mma_attention_rows_per_block())),
                      (registry.mma_attention_threads(),),
                      (q_args[0], k_args[0], v_args[0], o.transpose(0, 2, 1, 3), lse, lengths, *q_args[1:],
                       *k_args[1:], *v_args[1:], i32(heads), i32(len_q), i32(len_k), i32(causal), f32(scale),
                       f32(dropout_p), *seed_arguments(seed, q), numpy.uint64(offset)),
                      head_dim=dim, shared_mem=registry.mma_attention_shared_bytes(kernel, dim),
                      cost=_cost(2, q, k, causal, (q, k, v, o, lse), "tensor"))
    return o, lse


def attention_mma_backward(q, k, v, o, lse, grad_o, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                           seed=0, offset=0, dtype=None):
    """Returns (grad_q, grad_k, grad_v) of ``attention_mma_forward``, each (batch, heads, len, head_dim)
    as a view of a (batch, len, heads, head_dim) array, or side by side as q, k and v are
    (``gradient_buffers``); ``grad_o`` is copied to o's layout if it is not in it (``o`` is, as the
    forward returns it)."""
    _check_inputs(q, k, v, split_heads=True)
    name = element_dtype(q, dtype)
    xp = array_module(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    lengths = _key_lengths_argument(key_lengths, batch, xp)
    o, grad_o = projection_layout(o), projection_layout(grad_o.astype(q.dtype, copy=False))
    grad_q, grad_k, grad_v = gradient_buffers(q, k, v)
    if not batch * heads:
        return grad_q, grad_k, grad_v
    (q, q_args), (k, k_args), (v, v_args) = _strided(q), _strided(k), _strided(v)
    strides = (*q_args[1:], *k_args[1:], *v_args[1:])
    tail = (i32(heads), i32(len_q), i32(len_k), i32(causal), f32(scale), f32(dropout_p), *seed_arguments(seed, q),
            numpy.uint64(offset))
    rows, threads = registry.mma_attention_rows_per_block(), (registry.mma_attention_threads(),)
    delta = xp.empty(batch * len_q * heads, dtype=numpy.float32)  # indexed by o's rows: (b·len_q + i)·heads + h
    grad_rows = grad_o.transpose(0, 2, 1, 3)  # C-contiguous (batch, len_q, heads, d), as o
    if len_q:
        o_rows = o.transpose(0, 2, 1, 3)  # C-contiguous (batch, len_q, heads, d): rows of d
        warps = registry.ATTENTION_WARPS
        launch.launch("attention_backward_delta", name, (math.ceil(delta.size / warps),),
                      (registry.attention_threads(),), (o_rows, grad_rows, delta, numpy.int64(delta.size)),
                      head_dim=dim)
        kernel = "attention_mma_backward_q"
        launch.launch(kernel, name, (batch * heads, math.ceil(len_q / rows)), threads,
                      (q_args[0], k_args[0], v_args[0], grad_rows, lse, delta, numpy.uint64(pointer(grad_q)), lengths,
                       *strides, _row_stride(grad_q), *tail), head_dim=dim,
                      shared_mem=registry.mma_attention_shared_bytes(kernel, dim),
                      cost=_cost(3, q, k, causal, (q, k, v, grad_o, lse, delta, grad_q), "tensor"))
    if len_k:
        kernel = "attention_mma_backward_kv"
        launch.launch(kernel, name, (batch * heads, math.ceil(len_k / rows)), threads,
                      (q_args[0], k_args[0], v_args[0], grad_rows, lse, delta, numpy.uint64(pointer(grad_k)),
                       numpy.uint64(pointer(grad_v)), lengths, *strides, _row_stride(grad_k), _row_stride(grad_v),
                       *tail),
                      head_dim=dim, shared_mem=registry.mma_attention_shared_bytes(kernel, dim),
                      cost=_cost(4, q, k, causal, (q, k, v, grad_o, lse, delta, grad_k, grad_v), "tensor"))
    return grad_q, grad_k, grad_v
