"""The launchers of adam.cu: the global gradient norm, clipping, the non-finite skip and Adam's
update of many arrays in two launches, every per-step value read from device memory.

Reference: ``optim.adam.fused_update``. An ``AdamPlan`` holds the pointer tables and
chunk lists of one fixed list of arrays (chunks of ``registry.ADAM_CHUNK`` elements, blocks of
``registry.ADAM_BLOCK`` threads); ``ADAM_HYPER`` names the entries of the per-step scalar buffer
and ``AdamPlan.COPY_TYPES`` the codes adam.cu gives the compute copies' element types: both are
facts of adam.cu alone, so they live here. The kernels and their element types are registered in
``registry.KERNELS``.
"""

import numpy

from .. import backend
from . import launch, registry
from .arguments import array_module, f32, i32, pointer

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
        xp = array_module(*params)
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
        itemsize = params[0].itemsize if params else 4
        copy_bytes = sum(c.nbytes for c in present)
        #: bytes the norm pass reads (the gradients) and the update reads and writes (parameters,
        #: gradients and moments read, parameters and moments written, the compute copies written)
        self.norm_bytes, self.update_bytes = sum(sizes) * itemsize, 7 * sum(sizes) * itemsize + copy_bytes


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
    copy, so a CUDA graph can capture it. Semantics: kernels/adam.cu, optim.adam.fused_update."""
    like = plan.sizes
    hyper = _device_buffer("hyper", hyper, numpy.float32, len(ADAM_HYPER), like)
    result = _device_buffer("result", result, numpy.float32, 2, like)
    loss = numpy.uint64(0) if loss is None else _device_buffer("loss", loss, numpy.float32, 1, like)
    name = dtype or plan.dtype
    if name != plan.dtype:
        raise TypeError(f"adam: plan of {plan.dtype} arrays passed as {name}")
    chunks = (plan.sizes, plan.chunk_tensor, plan.chunk_start, i32(plan.chunk_size))
    if plan.chunks:
        launch.launch("adam_norm_partials", name, (plan.chunks,), (registry.ADAM_BLOCK,),
                      (plan.tables[1], *chunks, plan.partials), cost=(plan.norm_bytes, 0, "memory"))
    launch.launch("adam_update", name, (max(plan.chunks, 1),), (registry.ADAM_BLOCK,),
                  (*plan.tables, plan.copies, i32(plan.copy_type), *chunks, i32(plan.chunks), plan.partials,
                   hyper, loss, result, f32(beta1), f32(beta2), f32(eps), f32(weight_decay)),
                  cost=(plan.update_bytes, 0, "memory"))
