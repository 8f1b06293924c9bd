"""Python entry points of the CUDA kernels: shapes, grids, output buffers.

Each function takes CuPy arrays (the GPU path) or NumPy float32 arrays (the same kernel
through the CPU emulation, for tests) and returns arrays of the same kind. bfloat16 arrays are
``ml_dtypes.bfloat16`` (``backend.bfloat16``) on both backends; ``dtype``, where given, must name
the arrays' own dtype. Block sizes and grids come from ``registry`` (read at each launch).
"""

import math

import numpy

from .. import backend
from . import launch as _launch
from . import registry
from .registry import HEAD_DIMS, cuda_type


def _xp(*arrays):
    return backend.get_array_module(*arrays)


def _element_dtype(array, dtype):
    name = dtype or array.dtype.name
    cuda_type(name)  # a clear TypeError for an unsupported dtype
    if array.dtype.name != name:
        raise TypeError(f"array of dtype {array.dtype} passed as {name}")
    return name


def _rows(array, row_size):
    """How many rows of ``row_size`` elements ``array`` holds (0 for an empty row)."""
    return array.size // max(row_size, 1)


def _contiguous(*arrays):
    return [_xp(a).ascontiguousarray(a) for a in arrays]


def _i32(n):
    return numpy.int32(n)


def _f32(x):
    return numpy.float32(x)


class DeviceSeed:
    """A Philox seed that a kernel reads from device memory: element ``index`` of the 1-D uint64
    array ``table`` (CuPy on the GPU, NumPy under the emulation). A captured CUDA graph holds the
    element's address, not its value, so refilling the table before a replay gives the replay new
    dropout masks. Accepted wherever a kernel entry point takes ``seed``."""

    def __init__(self, table, index):
        if getattr(table, "ndim", None) != 1 or table.dtype != numpy.uint64:
            raise TypeError(f"DeviceSeed: table must be a 1-D uint64 array, got "
                            f"{getattr(table, 'dtype', type(table).__name__)} of shape {getattr(table, 'shape', None)}")
        if not 0 <= index < table.size:
            raise IndexError(f"DeviceSeed: index {index} outside a table of {table.size} seeds")
        self.table, self.index = table, int(index)

    @property
    def pointer(self):
        """The address of the seed (``unsigned long long*``)."""
        return pointer(self.table) + self.index * self.table.strides[0]

    def __repr__(self):
        return f"DeviceSeed(index={self.index} of {self.table.size} on {backend.device_of(self.table)})"


def _seed_args(seed, like):
    """The (seed, seed_ptr) launch arguments of an int seed or a ``DeviceSeed`` (value 0 and its
    address: the kernel reads the seed there, ``tf::resolve_seed``) for a launch on ``like``'s device."""
    if isinstance(seed, DeviceSeed):
        if backend.is_cupy_array(seed.table) != backend.is_cupy_array(like):
            raise ValueError(f"{seed!r} must live on the device of the kernel's arrays "
                             f"({backend.device_of(like)})")
        return numpy.uint64(0), numpy.uint64(seed.pointer)
    return numpy.uint64(seed), numpy.uint64(0)


# ------------------------------------------------------------------------ softmax
def softmax_forward(x, log=False, dtype=None):
    """softmax (or log_softmax) over the last axis."""
    (x,) = _contiguous(x)
    name = _element_dtype(x, dtype)
    cols = x.shape[-1]
    rows = _rows(x, cols)
    y = _xp(x).empty_like(x)
    if rows and cols:
        _launch.launch("softmax_forward", name, (rows,), (registry.row_threads(cols),), (x, y, _i32(cols), _i32(log)))
    return y


def softmax_backward(y, grad_y, log=False, dtype=None):
    y, grad_y = _contiguous(y, grad_y)
    name = _element_dtype(y, dtype)
    cols = y.shape[-1]
    rows = _rows(y, cols)
    grad_x = _xp(y).empty_like(y)
    if rows and cols:
        _launch.launch("softmax_backward", name, (rows,), (registry.row_threads(cols),),
                       (y, grad_y, grad_x, _i32(cols), _i32(log)))
    return grad_x


# ------------------------------------------------------------------------ layer norm
def layer_norm_forward(x, weight, bias, eps=1e-5, dtype=None):
    """Returns (y, mean, rstd); mean and rstd are float32 with one entry per row."""
    x, weight, bias = _contiguous(x, weight, bias)
    name = _element_dtype(x, dtype)
    xp, cols = _xp(x), x.shape[-1]
    rows = _rows(x, cols)
    y = xp.empty_like(x)
    mean = xp.empty(rows, dtype=numpy.float32)
    rstd = xp.empty(rows, dtype=numpy.float32)
    if rows and cols:
        _launch.launch("layer_norm_forward", name, (rows,), (registry.row_threads(cols),),
                       (x, weight, bias, y, mean, rstd, _i32(cols), _f32(eps)))
    return y, mean, rstd


def layer_norm_backward(x, weight, grad_y, mean, rstd, need_input=True, need_params=True, dtype=None,
                        rows_per_chunk=None):
    """Returns (grad_x, grad_weight, grad_bias); an entry is None when not asked for.
    ``rows_per_chunk`` (default ``registry.LAYER_NORM_ROWS_PER_CHUNK``): rows per block of dw/db's first stage."""
    x, weight, grad_y = _contiguous(x, weight, grad_y)
    name = _element_dtype(x, dtype)
    xp, cols = _xp(x), x.shape[-1]
    rows = _rows(x, cols)
    grad_x = grad_w = grad_b = None
    if need_input:
        grad_x = xp.empty_like(x)
        if rows and cols:
            _launch.launch("layer_norm_backward_input", name, (rows,), (registry.row_threads(cols),),
                           (x, weight, grad_y, mean, rstd, grad_x, _i32(cols)))
    if need_params:
        rows_per_chunk = rows_per_chunk or registry.LAYER_NORM_ROWS_PER_CHUNK
        chunks = max(1, math.ceil(rows / rows_per_chunk))
        partial_w = xp.zeros((chunks, cols), dtype=numpy.float32)
        partial_b = xp.zeros((chunks, cols), dtype=numpy.float32)
        grad_w, grad_b = xp.empty_like(weight), xp.empty_like(weight)
        threads = registry.COLUMN_BLOCK
        column_blocks = math.ceil(cols / threads)
        if rows and cols:
            _launch.launch("layer_norm_backward_params", name, (column_blocks, chunks), (threads,),
                           (x, grad_y, mean, rstd, partial_w, partial_b, _i32(rows), _i32(cols),
                            _i32(rows_per_chunk)))
        if cols:
            _launch.launch("layer_norm_reduce_params", name, (column_blocks,), (threads,),
                           (partial_w, partial_b, grad_w, grad_b, _i32(chunks), _i32(cols)))
    return grad_x, grad_w, grad_b


# ------------------------------------------------------------------------ cross entropy
def _targets(target, xp):
    return xp.ascontiguousarray(target.reshape(-1), dtype=numpy.int64)


def cross_entropy_forward(logits, target, smoothing=0.0, ignore_index=None, dtype=None):
    """Per-row (loss, nll, lse) as float32 for logits (..., V) flattened to rows."""
    (logits,) = _contiguous(logits)
    name = _element_dtype(logits, dtype)
    xp, vocab = _xp(logits), logits.shape[-1]
    rows = _rows(logits, vocab)
    target = _targets(target, xp)
    loss, nll, lse = (xp.empty(rows, dtype=numpy.float32) for _ in range(3))
    if rows:
        _launch.launch("cross_entropy_forward", name, (rows,), (registry.row_threads(vocab),),
                       (logits, target, loss, nll, lse, _i32(vocab), numpy.int64(ignore_index or 0),
                        _i32(ignore_index is not None), _f32(smoothing)))
    return loss, nll, lse


def cross_entropy_backward(logits, target, lse, grad_loss, grad_nll, smoothing=0.0, ignore_index=None, dtype=None):
    """d logits from per-row upstream gradients of loss and nll (float32 arrays of rows)."""
    (logits,) = _contiguous(logits)
    name = _element_dtype(logits, dtype)
    xp, vocab = _xp(logits), logits.shape[-1]
    rows = _rows(logits, vocab)
    target = _targets(target, xp)
    grad_loss, grad_nll = (xp.ascontiguousarray(g, dtype=numpy.float32) for g in (grad_loss, grad_nll))
    grad = xp.empty_like(logits)
    if rows:
        _launch.launch("cross_entropy_backward", name, (rows,), (registry.row_threads(vocab),),
                       (logits, target, lse, grad_loss, grad_nll, grad, _i32(vocab),
                        numpy.int64(ignore_index or 0), _i32(ignore_index is not None), _f32(smoothing)))
    return grad


# ------------------------------------------------------------------------ adam
ADAM_HYPER = ("step_size", "bias2", "grad_scale", "max_grad_norm", "skip_nonfinite")
"""The float32 entries of Adam's per-step scalar buffer ``hyper``, in order (kernels/adam.cu):
lr/(1 − β₁ᵗ), 1 − β₂ᵗ, the loss scale s (1 without), the clipping norm (≤ 0: none) and 1 to skip a
non-finite update (0 to apply it anyway)."""


class AdamPlan:
    """Pointer tables and chunk lists for one fixed list of parameter/grad/moment arrays, and the
    per-chunk buffer of the gradient-norm pass (``partials``, float64)."""

    #: the kernel's code of a compute copy's element type
    COPY_TYPES = {"float16": 1, "bfloat16": 2}

    def __init__(self, params, grads, m, v, chunk_size=None, copies=None):
        """``chunk_size`` elements per block (default ``registry.ADAM_CHUNK``). ``copies``: per
        parameter its half-precision compute copy or None (mixed precision; one half dtype for
        all), which the update rounds the new values into."""
        chunk_size = chunk_size or registry.ADAM_CHUNK
        xp = _xp(*params)
        sizes = [p.size for p in params]
        for name, arrays in (("params", params), ("grads", grads), ("m", m), ("v", v)):
            for i, (a, p) in enumerate(zip(arrays, params)):
                if (a.shape != p.shape or a.dtype != params[0].dtype or not a.flags.c_contiguous
                        or backend.is_cupy_array(a) != (xp is not numpy)):
                    raise ValueError(f"adam: {name}[{i}] must be a contiguous {params[0].dtype} array of shape "
                                     f"{p.shape} on the parameters' device, got {a.dtype} {a.shape}")
        chunk_tensor, chunk_start = [], []
        for i, n in enumerate(sizes):
            for start in range(0, n, chunk_size):
                chunk_tensor.append(i)
                chunk_start.append(start)
        self.tables = [xp.asarray(numpy.array([pointer(a) for a in arrays], dtype=numpy.uint64))
                       for arrays in (params, grads, m, v)]
        self.sizes = xp.asarray(numpy.array(sizes, dtype=numpy.int64))
        self.chunk_tensor = xp.asarray(numpy.array(chunk_tensor, dtype=numpy.int32))
        self.chunk_start = xp.asarray(numpy.array(chunk_start, dtype=numpy.int64))
        self.chunks, self.chunk_size = len(chunk_tensor), chunk_size
        self.partials = xp.zeros(max(self.chunks, 1), dtype=numpy.float64)
        self.dtype = params[0].dtype.name if params else "float32"
        self.copies, self.copy_type = numpy.uint64(0), 0  # a null table: no compute copies
        present = [c for c in copies or () if c is not None]
        if present:
            names = {c.dtype.name for c in present}
            if len(names) != 1 or not names <= set(self.COPY_TYPES):
                raise TypeError(f"adam: compute copies must share one dtype of {', '.join(self.COPY_TYPES)}, "
                                f"got {', '.join(sorted(names))}")
            for i, (c, p) in enumerate(zip(copies, params)):
                if c is not None and (c.shape != p.shape or not c.flags.c_contiguous):
                    raise ValueError(f"adam: copies[{i}] must be a contiguous array of shape {p.shape}, got {c.shape}")
            self.copies = xp.asarray(numpy.array([0 if c is None else pointer(c) for c in copies], dtype=numpy.uint64))
            self.copy_type = self.COPY_TYPES[names.pop()]
        self.keep_alive = (params, grads, m, v, copies)


def pointer(array):
    """The device (CuPy) or host (NumPy) address of ``array``'s first element."""
    return array.data.ptr if backend.is_cupy_array(array) else array.ctypes.data


def _device_buffer(label, array, dtype, size, like):
    """``array`` checked to be a contiguous ``dtype`` array of at least ``size`` elements on the
    device of ``like`` (it is passed as it is: no copy, so a captured graph reads it at replay)."""
    dtype = numpy.dtype(dtype)
    if (getattr(array, "dtype", None) != dtype or array.size < size or not array.flags.c_contiguous
            or backend.is_cupy_array(array) != backend.is_cupy_array(like)):
        raise ValueError(f"adam: {label} must be a contiguous {dtype} array of at least {size} elements on the "
                         f"parameters' device ({backend.device_of(like)}), got "
                         f"{getattr(array, 'dtype', type(array).__name__)} {getattr(array, 'shape', '')}")
    return array


def grad_norm_adam_update(plan, hyper, result, beta1, beta2, eps, weight_decay=0.0, loss=None, dtype=None):
    """The global gradient norm, clipping, the non-finite skip and Adam's update of every array in
    ``plan`` (in place, compute copies included), in two launches that read every per-step value
    from device memory: ``hyper`` (float32, ``ADAM_HYPER``), ``loss`` (a float32 device scalar, or
    None: not checked) and the plan's ``partials``; they write ``result`` (float32: the unscaled
    norm, 1.0 if the update was applied else 0.0). No host synchronisation and no host-to-device
    copy, so a CUDA graph can capture it. Semantics: kernels/adam.cu, optim.adam.device_update_reference."""
    like = plan.sizes
    hyper = _device_buffer("hyper", hyper, numpy.float32, len(ADAM_HYPER), like)
    result = _device_buffer("result", result, numpy.float32, 2, like)
    loss = numpy.uint64(0) if loss is None else _device_buffer("loss", loss, numpy.float32, 1, like)
    name = dtype or plan.dtype
    if name != plan.dtype:
        raise TypeError(f"adam: plan of {plan.dtype} arrays passed as {name}")
    chunks = (plan.sizes, plan.chunk_tensor, plan.chunk_start, _i32(plan.chunk_size))
    if plan.chunks:
        _launch.launch("adam_norm_partials", name, (plan.chunks,), (registry.ADAM_BLOCK,),
                       (plan.tables[1], *chunks, plan.partials))
    _launch.launch("adam_update", name, (max(plan.chunks, 1),), (registry.ADAM_BLOCK,),
                   (*plan.tables, plan.copies, _i32(plan.copy_type), *chunks, _i32(plan.chunks), plan.partials,
                    hyper, loss, result, _f32(beta1), _f32(beta2), _f32(eps), _f32(weight_decay)))


# ------------------------------------------------------------------------ dropout
def _elementwise_grid(n, per_thread=1):
    """(blocks, threads) of a grid-stride launch over n elements, ``per_thread`` each."""
    items = math.ceil(n / per_thread)
    threads = registry.row_threads(items)
    return min(registry.DROPOUT_MAX_BLOCKS, math.ceil(items / threads)), threads


def dropout_forward(x, p, seed, offset=0, scale=None, dtype=None):
    """Inverted dropout with the mask from Philox: returns (y, keep), keep a bool array of x's shape.

    keep_i = philox_uniform(seed, offset, i) >= p over x's elements in C order (``seed`` an int or
    a ``DeviceSeed``, as for every kernel here that draws dropout);
    y = x ∘ keep · scale, scale = 1/(1 − p) unless given (functional passes x's dtype's value).
    """
    (x,) = _contiguous(x)
    name = _element_dtype(x, dtype)
    xp = _xp(x)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    y = xp.empty_like(x)
    keep = xp.empty(x.shape, dtype=numpy.bool_)
    if x.size:
        blocks, threads = _elementwise_grid(x.size, 4)  # one thread per 4 elements: one Philox block
        _launch.launch("dropout_forward", name, (blocks,), (threads,),
                       (x, y, keep, numpy.int64(x.size), _f32(p), _f32(scale), *_seed_args(seed, x),
                        numpy.uint64(offset)))
    return y, keep


# ------------------------------------------------------------------------ bias + ReLU + dropout
def bias_relu_dropout_forward(y, bias, p=0.0, seed=0, offset=0, scale=None, dtype=None):
    """z = dropout(max(0, y + bias)) in place on y (rows of len(bias)); returns (z, mask) with
    mask = [y + bias > 0] ∧ keep, keep drawn as ``dropout_forward`` draws it (all True at p = 0)."""
    if not y.flags.c_contiguous:
        raise ValueError("bias_relu_dropout: y must be C-contiguous (it is updated in place)")
    (bias,) = _contiguous(bias)
    if bias.shape != (y.shape[-1],):
        raise ValueError(f"bias_relu_dropout: bias must have shape ({y.shape[-1]},), got {tuple(bias.shape)}")
    name = _element_dtype(y, dtype)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    mask = _xp(y).empty(y.shape, dtype=numpy.bool_)
    if y.size:
        blocks, threads = _elementwise_grid(y.size, 4)  # one Philox block per 4 elements
        _launch.launch("bias_relu_dropout_forward", name, (blocks,), (threads,),
                       (y, bias, mask, numpy.int64(y.size), _i32(y.shape[-1]), _f32(p), _f32(scale),
                        *_seed_args(seed, y), numpy.uint64(offset)))
    return y, mask


def bias_relu_dropout_backward(grad_z, mask, scale=1.0, dtype=None):
    """dy = dz ∘ mask · scale."""
    grad_z, mask = _contiguous(grad_z, mask)
    name = _element_dtype(grad_z, dtype)
    grad_y = _xp(grad_z).empty_like(grad_z)
    if grad_z.size:
        blocks, threads = _elementwise_grid(grad_z.size)
        _launch.launch("bias_relu_dropout_backward", name, (blocks,), (threads,),
                       (grad_z, mask, grad_y, numpy.int64(grad_z.size), _f32(scale)))
    return grad_y


# ------------------------------------------------------------------------ residual + dropout + layer norm
def residual_layer_norm_forward(x, y, weight, bias, p=0.0, seed=0, offset=0, scale=None, eps=1e-5, dtype=None):
    """out = layer_norm(x + dropout(y)) over the last axis in one kernel: returns (out, h, keep, mean,
    rstd) with h = x + y ∘ keep · scale (what the backward normalises again), keep a bool array of
    y's shape (all True at p = 0) drawn as ``dropout_forward`` draws it, mean/rstd float32 per row."""
    x, y, weight, bias = _contiguous(x, y, weight, bias)
    if x.shape != y.shape:
        raise ValueError(f"residual_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
    name = _element_dtype(x, dtype)
    xp, cols = _xp(x), x.shape[-1]
    rows = _rows(x, cols)
    scale = 1.0 / (1.0 - p) if scale is None else scale
    h, out = xp.empty_like(x), xp.empty_like(x)
    keep = xp.empty(x.shape, dtype=numpy.bool_)
    mean = xp.empty(rows, dtype=numpy.float32)
    rstd = xp.empty(rows, dtype=numpy.float32)
    if rows and cols:
        _launch.launch("residual_layer_norm_forward", name, (rows,), (registry.row_threads(cols),),
                       (x, y, weight, bias, h, out, keep, mean, rstd, _i32(cols), _f32(p), _f32(scale), _f32(eps),
                        *_seed_args(seed, x), numpy.uint64(offset)))
    return out, h, keep, mean, rstd


def residual_layer_norm_backward(h, weight, grad_out, mean, rstd, keep, scale=1.0, need_params=True, dtype=None):
    """(grad_x, grad_y, grad_weight, grad_bias) of ``residual_layer_norm_forward``; the parameter
    gradients (None unless ``need_params``) by layer norm's two-stage reduction on h."""
    h, weight, grad_out, keep = _contiguous(h, weight, grad_out, keep)
    name = _element_dtype(h, dtype)
    xp, cols = _xp(h), h.shape[-1]
    rows = _rows(h, cols)
    grad_x, grad_y = xp.empty_like(h), xp.empty_like(h)
    if rows and cols:
        _launch.launch("residual_layer_norm_backward", name, (rows,), (registry.row_threads(cols),),
                       (h, weight, grad_out, mean, rstd, keep, grad_x, grad_y, _i32(cols), _f32(scale)))
    grad_w = grad_b = None
    if need_params:
        _, grad_w, grad_b = layer_norm_backward(h, weight, grad_out, mean, rstd, need_input=False, dtype=dtype)
    return grad_x, grad_y, grad_w, grad_b


# ------------------------------------------------------------------------ attention
def _check_attention(q, k, v, key_lengths):
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"attention kernel: q, k, v must be (batch·heads, len, head_dim), got {q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"attention kernel: shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[2] not in HEAD_DIMS:
        raise ValueError(f"attention kernel: head dimension {q.shape[2]} is not supported (supported: {HEAD_DIMS})")


def attention_forward(q, k, v, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                      dtype=None):
    """Fused attention on (batch·heads, len, head_dim) arrays; returns (o, lse)."""
    _check_attention(q, k, v, key_lengths)
    q, k, v = _contiguous(q, k, v)
    name = _element_dtype(q, dtype)
    xp = _xp(q)
    bh, len_q, dim = q.shape
    len_k = k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    o = xp.empty_like(q)
    lse = xp.empty((bh, len_q), dtype=numpy.float32)
    lengths = _key_lengths(key_lengths, bh // heads, xp)
    if bh and len_q:
        rows = registry.attention_rows_per_block(dim)
        _launch.launch("attention_forward", name, (bh, math.ceil(len_q / rows)), (registry.attention_threads(),),
                       (q, k, v, o, lse, lengths, _i32(heads), _i32(len_q), _i32(len_k), _i32(causal), _f32(scale),
                        _f32(dropout_p), *_seed_args(seed, q), numpy.uint64(offset)), head_dim=dim)
    return o, lse


def attention_backward(q, k, v, o, lse, grad_o, heads, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                       seed=0, offset=0, dtype=None):
    """Returns (grad_q, grad_k, grad_v), recomputing the probabilities from ``lse``."""
    _check_attention(q, k, v, key_lengths)
    q, k, v, o, grad_o = _contiguous(q, k, v, o, grad_o)
    name = _element_dtype(q, dtype)
    xp = _xp(q)
    bh, len_q, dim = q.shape
    len_k = k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    lengths = _key_lengths(key_lengths, bh // heads, xp)
    grad_q, grad_k, grad_v = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
    delta = xp.empty((bh, len_q), dtype=numpy.float32)
    rows, threads = registry.attention_rows_per_block(dim), registry.attention_threads()
    tail = (lengths, _i32(heads), _i32(len_q), _i32(len_k), _i32(causal), _f32(scale), _f32(dropout_p),
            *_seed_args(seed, q), numpy.uint64(offset))
    if bh and len_q:
        delta_blocks = math.ceil(bh * len_q / registry.ATTENTION_WARPS)  # one warp per row
        _launch.launch("attention_backward_delta", name, (delta_blocks,), (threads,),
                       (o, grad_o, delta, numpy.int64(bh * len_q)), head_dim=dim)
        _launch.launch("attention_backward_q", name, (bh, math.ceil(len_q / rows)), (threads,),
                       (q, k, v, grad_o, lse, delta, grad_q, *tail), head_dim=dim)
    if bh and len_k:
        _launch.launch("attention_backward_kv", name, (bh, math.ceil(len_k / rows)), (threads,),
                       (q, k, v, grad_o, lse, delta, grad_k, grad_v, *tail), head_dim=dim)
    return grad_q, grad_k, grad_v


def _key_lengths(key_lengths, batch, xp):
    """int32 array of per-sequence key counts, or a null pointer (every key visible)."""
    if key_lengths is None:
        return numpy.uint64(0)  # NULL for `const int*`
    lengths = xp.ascontiguousarray(key_lengths, dtype=numpy.int32)
    if lengths.shape != (batch,):
        raise ValueError(f"attention kernel: key_lengths must have shape ({batch},), got {tuple(lengths.shape)}")
    return lengths


# ------------------------------------------------------------------------ attention on tensor cores
def _check_mma_attention(q, k, v):
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"tensor-core attention: q, k, v must be (batch, heads, len, head_dim), got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"tensor-core attention: shapes do not agree: q {q.shape}, k {k.shape}, v {v.shape}")
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"tensor-core attention: head dimension {q.shape[3]} is not supported (supported: {HEAD_DIMS})")
    if not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"tensor-core attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")


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
    xp = _xp(array)
    merged = array.transpose(0, 2, 1, 3)
    return array if merged.flags.c_contiguous else xp.ascontiguousarray(merged).transpose(0, 2, 1, 3)


def _strided(array):
    """(pointer, batch, head, row strides in elements) of a (batch, heads, len, d) operand, copied
    to the projection layout first when the kernel cannot read it in place."""
    if not _readable_in_place(array):
        array = projection_layout(array)
    strides = [numpy.int64(s // array.itemsize) for s in array.strides[:3]]
    return array, [numpy.uint64(pointer(array)), *strides]


def _projection_empty(xp, batch, heads, length, dim, dtype):
    return xp.empty((batch, length, heads, dim), dtype=dtype).transpose(0, 2, 1, 3)


def attention_mma_forward(q, k, v, key_lengths=None, causal=False, scale=None, dropout_p=0.0, seed=0, offset=0,
                          dtype=None):
    """Fused attention on tensor cores (attention_mma.cu) for float16 or bfloat16 q, k, v of shape
    (batch, heads, len, head_dim) with any strides (read in place when 16-byte aligned, the
    layout of a head split by reshape and transpose). Returns (o, lse): o (batch, heads, len_q,
    head_dim) as a view of a (batch, len_q, heads, head_dim) array, lse (batch·heads, len_q) float32."""
    _check_mma_attention(q, k, v)
    name = _element_dtype(q, dtype)
    registry.name_expression("attention_mma_forward", name, q.shape[3])  # a clear error for float32
    xp = _xp(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    o = _projection_empty(xp, batch, heads, len_q, dim, q.dtype)
    lse = xp.empty((batch * heads, len_q), dtype=numpy.float32)
    lengths = _key_lengths(key_lengths, batch, xp)
    if batch * heads and len_q:
        (q, q_args), (k, k_args), (v, v_args) = _strided(q), _strided(k), _strided(v)
        kernel = "attention_mma_forward"
        _launch.launch(kernel, name, (batch * heads, math.ceil(len_q / registry.mma_attention_rows_per_block())),
                       (registry.mma_attention_threads(),),
                       (q_args[0], k_args[0], v_args[0], o.transpose(0, 2, 1, 3), lse, lengths, *q_args[1:], *k_args[1:], *v_args[1:],
                        _i32(heads), _i32(len_q), _i32(len_k), _i32(causal), _f32(scale), _f32(dropout_p),
                        *_seed_args(seed, q), numpy.uint64(offset)),
                       head_dim=dim, shared_mem=registry.mma_attention_shared_bytes(kernel, dim))
    return o, lse


def attention_mma_backward(q, k, v, o, lse, grad_o, key_lengths=None, causal=False, scale=None, dropout_p=0.0,
                           seed=0, offset=0, dtype=None):
    """Returns (grad_q, grad_k, grad_v) of ``attention_mma_forward``, each (batch, heads, len, head_dim)
    as a view of a (batch, len, heads, head_dim) array; ``grad_o`` is copied to that layout if it is
    not in it (``o`` is, as the forward returns it)."""
    _check_mma_attention(q, k, v)
    name = _element_dtype(q, dtype)
    xp = _xp(q)
    batch, heads, len_q, dim = q.shape
    len_k = k.shape[2]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    lengths = _key_lengths(key_lengths, batch, xp)
    o, grad_o = projection_layout(o), projection_layout(grad_o.astype(q.dtype, copy=False))
    grad_q = _projection_empty(xp, batch, heads, len_q, dim, q.dtype)
    grad_k, grad_v = (_projection_empty(xp, batch, heads, len_k, dim, q.dtype) for _ in range(2))
    if not batch * heads:
        return grad_q, grad_k, grad_v
    (q, q_args), (k, k_args), (v, v_args) = _strided(q), _strided(k), _strided(v)
    strides = (*q_args[1:], *k_args[1:], *v_args[1:])
    tail = (_i32(heads), _i32(len_q), _i32(len_k), _i32(causal), _f32(scale), _f32(dropout_p), *_seed_args(seed, q),
            numpy.uint64(offset))
    rows, threads = registry.mma_attention_rows_per_block(), (registry.mma_attention_threads(),)
    delta = xp.empty(batch * len_q * heads, dtype=numpy.float32)  # indexed by o's rows: (b·len_q + i)·heads + h
    grad_rows = grad_o.transpose(0, 2, 1, 3)  # C-contiguous (batch, len_q, heads, d), as o
    if len_q:
        o_rows = o.transpose(0, 2, 1, 3)  # C-contiguous (batch, len_q, heads, d): rows of d
        warps = registry.ATTENTION_WARPS
        _launch.launch("attention_backward_delta", name, (math.ceil(delta.size / warps),), (registry.attention_threads(),),
                       (o_rows, grad_rows, delta, numpy.int64(delta.size)), head_dim=dim)
        kernel = "attention_mma_backward_q"
        _launch.launch(kernel, name, (batch * heads, math.ceil(len_q / rows)), threads,
                       (q_args[0], k_args[0], v_args[0], grad_rows, lse, delta, grad_q.transpose(0, 2, 1, 3), lengths,
                        *strides, *tail), head_dim=dim, shared_mem=registry.mma_attention_shared_bytes(kernel, dim))
    if len_k:
        kernel = "attention_mma_backward_kv"
        _launch.launch(kernel, name, (batch * heads, math.ceil(len_k / rows)), threads,
                       (q_args[0], k_args[0], v_args[0], grad_rows, lse, delta, grad_k.transpose(0, 2, 1, 3),
                        grad_v.transpose(0, 2, 1, 3), lengths, *strides, *tail),
                       head_dim=dim, shared_mem=registry.mma_attention_shared_bytes(kernel, dim))
    return grad_q, grad_k, grad_v


# ------------------------------------------------------------------------ bfloat16
to_bfloat16 = backend.to_bfloat16  # float32 -> backend.bfloat16, round to nearest even, on x's device
from_bfloat16 = backend.from_bfloat16  # backend.bfloat16 -> float32, exact


# ------------------------------------------------------------------------ embedding
def embedding_backward(ids, grad_out, vocab, dtype=None):
    """dW (vocab, cols) of an embedding lookup: the rows of ``grad_out`` (positions, cols) summed into
    the rows ``ids`` (positions,) name, in position order (embedding.cu: deterministic, no atomics)."""
    xp = _xp(grad_out)
    grad_out = xp.ascontiguousarray(grad_out)
    name = _element_dtype(grad_out, dtype)
    ids = xp.ascontiguousarray(ids.reshape(-1), dtype=numpy.int32)
    positions, cols = grad_out.shape
    if len(ids) != positions:
        raise ValueError(f"embedding_backward: {len(ids)} ids for {positions} rows of grad_out")
    grad_weight = xp.empty((vocab, cols), dtype=grad_out.dtype)
    if vocab and cols:
        _launch.launch("embedding_backward", name, (vocab,), (registry.row_threads(positions),),
                       (ids, grad_out, grad_weight, _i32(positions), _i32(cols)))
    return grad_weight
