"""Mixed precision: what runs in float16 or bfloat16, and the half-precision copies of the weights.

The rule is PyTorch's autocast, per op family, inside ``with amp.autocast("bf16"):``:

* matrix products (``F.linear``, ``F.linear_relu``, the tied output projection) and attention
  (``F.scaled_dot_product_attention``) take their inputs in the half type and accumulate in float32
  (cuBLAS' and the tensor-core kernels' float accumulators; on NumPy the product runs in float32
  and is rounded once);
* softmax, log-softmax, layer norm and the label-smoothed loss take float32 (a half input is cast
  up first): their sums of exponentials, means and variances need float32's range and precision;
* everything else (residual sums, dropout, ReLU) runs in the type of its inputs, by NumPy's
  promotion rules, so the residual stream stays float32 as under torch.autocast.

Parameters stay float32: they are the master weights Adam updates (with float32 moments). A
product reads a parameter through its **compute copy** (``compute_copy``), the parameter rounded to
the half type, made once and then refreshed by ``optim.Adam.step`` (on the GPU inside the fused
Adam kernel, so no extra pass). Its gradient arrives in float32 at the parameter, so gradient
accumulation, the all-reduce of data-parallel training and the gradient norm are float32 too, and
checkpoints hold float32 weights whatever the precision.

``Precision`` names the three policies (``fp32``, ``bf16``, ``fp16``); fp16 also needs dynamic loss
scaling (``optim.GradScaler``), bf16 does not (it has float32's exponent range).
"""

import contextlib
import dataclasses
import weakref

import numpy

from . import backend
from .tensor import Function, Tensor

__all__ = ["Precision", "PRECISIONS", "get_precision", "autocast", "active_dtype", "compute_copy",
           "half_args", "float32_args"]


@dataclasses.dataclass(frozen=True)
class Precision:
    """A training or inference precision: ``name`` (fp32, bf16, fp16), the ``compute_dtype`` of
    matrix products and attention (None for fp32: no autocast), named by ``compute_dtype_name``,
    and whether gradients need loss scaling (fp16's 5-bit exponent underflows below 6e-8)."""

    name: str
    compute_dtype_name: str | None
    loss_scaling: bool

    @property
    def compute_dtype(self):
        """The NumPy dtype (``backend.bfloat16`` for bf16, made only when asked for), or None."""
        if self.compute_dtype_name is None:
            return None
        return backend.bfloat16 if self.compute_dtype_name == "bfloat16" else numpy.dtype(self.compute_dtype_name)


PRECISIONS = {
    "fp32": Precision("fp32", None, False),
    "bf16": Precision("bf16", "bfloat16", False),
    "fp16": Precision("fp16", "float16", True),
}


def get_precision(precision):
    """A ``Precision`` from itself or its name; a clear error naming the choices otherwise."""
    if isinstance(precision, Precision):
        return precision
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return PRECISIONS[precision]


class _State:
    dtype = None  # the active compute dtype, None outside autocast
    # id(tensor) -> (tensor, its cast to ``dtype``) inside the innermost autocast: an activation that
    # feeds several products (the queries', keys' and values' input) is rounded once, as a parameter's
    # compute copy is (tinyformer's ops never change a tensor's values in place)
    casts = None


def active_dtype():
    """The half dtype matrix products run in now, or None (outside ``autocast``, or fp32)."""
    return _State.dtype


@contextlib.contextmanager
def autocast(precision="bf16"):
    """Run the ops inside in ``precision`` (a name or ``Precision``); fp32 changes nothing. Nests;
    the previous setting comes back on exit, also after an exception."""
    previous = _State.dtype, _State.casts
    _State.dtype, _State.casts = get_precision(precision).compute_dtype, {}
    try:
        yield
    finally:
        _State.dtype, _State.casts = previous


# ------------------------------------------------------------------ casts that autograd sees
class Cast(Function):
    """y = x rounded to ``dtype``;  dx = dy rounded to x's dtype. A float16 overflow becomes inf
    without a warning: the loss scaler looks for it."""

    passes_gradient_to_input = True  # a product may add its gradient into x's (autograd.GradTarget)

    def forward(self, x, dtype):
        self.source = x.dtype
        with numpy.errstate(over="ignore"):
            return backend.cast(x, dtype)

    def backward(self, g):
        with numpy.errstate(over="ignore", invalid="ignore"):
            return backend.cast(g, self.source), None


class CastWeight(Function):
    """A parameter's compute copy (see ``compute_copy``) as a graph node; its gradient arrives at
    the float32 parameter (or a product adds it into the parameter's gradient itself:
    ``passes_gradient_to_input``, autograd.GradTarget)."""

    passes_gradient_to_input = True

    def forward(self, weight, copy):
        return copy

    def backward(self, g):
        return g, None


# id(parameter) -> (a weak reference to it, the array the copy was made from, the half copy); keyed
# by id because a Tensor's == is elementwise; the entry goes when the parameter does.
_copies = {}


def _entry(param):
    entry = _copies.get(id(param))
    if entry is None or entry[0]() is not param or entry[1] is not param.data:
        return None
    return entry


def _keep(param, copy):
    key = id(param)
    _copies[key] = (weakref.ref(param, lambda _, key=key: _copies.pop(key, None)), param.data, copy)


def compute_copy(param, dtype):
    """``param``'s values rounded to ``dtype`` as an array, made once and kept while ``param.data``
    is the same array (only the optimiser's step changes it in place, and it refreshes the copy:
    see ``refresh_compute_copy``). Assigning a new ``param.data`` (``load_state_dict``, ``Module.to``)
    makes a new copy on the next use."""
    entry = _entry(param)
    if entry is None or entry[2].dtype != dtype:
        copy = _packed_copy(param.data, dtype)
        if copy is None:
            copy = backend.cast(param.data, dtype)
        _keep(param, copy)
        return copy
    return entry[2]


# id(buffer) -> (a weak reference to a buffer that packs parameters, its half-precision twin)
_packs = {}


def _packed_copy(data, dtype):
    """The compute copy of a parameter stored in one buffer with others (``backend.pack_back_to_back``:
    the queries', keys' and values' projections), as the same view of a half twin of that buffer,
    written now; so that parameters back to back have compute copies back to back, which one
    product reads as one matrix. None for a parameter with memory of its own."""
    root = backend.root_buffer(data)
    if root is data or root.ndim != 1 or root.dtype != data.dtype:
        return None
    key, entry = id(root), _packs.get(id(root))
    if entry is None or entry[0]() is not root or entry[1].dtype != dtype:
        try:
            reference = weakref.ref(root, lambda _, key=key: _packs.pop(key, None))
        except TypeError:  # an array type without weak references: a copy of its own
            return None
        like = root if type(root) is type(data) else root.view(type(data))  # the parameter's memory type
        entry = _packs[key] = (reference, backend.get_array_module(root).empty_like(like, dtype=dtype))
    offset = (backend.address(data) - backend.address(root)) // data.itemsize
    copy = entry[1][offset:offset + data.size].reshape(data.shape)
    copy[...] = backend.cast(data, dtype)
    return copy


def compute_copies(params):
    """The live compute copy of each parameter in ``params`` (None where it has none)."""
    return [None if (entry := _entry(p)) is None else entry[2] for p in params]


def refresh_compute_copy(param, copy):
    """Round ``param.data`` into ``copy`` (the optimiser's reference path; the fused Adam kernel
    writes the copy itself), and keep the copy tied to the current ``param.data``."""
    copy[...] = backend.cast(param.data, copy.dtype)
    _keep(param, copy)


def _half(x, dtype):
    if not isinstance(x, Tensor) or not backend.is_floating(x.dtype) or x.dtype == dtype:
        return x
    if getattr(x, "keeps_compute_copy", False):  # an nn.Parameter: its cached compute copy
        return CastWeight.apply(x, compute_copy(x, dtype))
    kept = _State.casts.get(id(x)) if _State.casts is not None else None
    if kept is not None and kept[0] is x and kept[1].dtype == dtype:
        return kept[1]
    cast = Cast.apply(x, dtype=dtype)
    if _State.casts is not None:
        _State.casts[id(x)] = (x, cast)
    return cast


def half_args(*tensors):
    """The tensors in the active compute dtype (parameters through their compute copies), for a
    matrix product or attention; unchanged outside autocast."""
    dtype = _State.dtype
    if dtype is None:
        return tensors
    return tuple(_half(t, dtype) for t in tensors)


def float32_args(*tensors):
    """Half-precision tensors cast up to float32, for softmax, layer norm and the loss; unchanged
    outside autocast."""
    if _State.dtype is None:
        return tensors
    return tuple(Cast.apply(t, dtype=numpy.float32) if isinstance(t, Tensor) and backend.is_half(t.dtype) else t
                 for t in tensors)
