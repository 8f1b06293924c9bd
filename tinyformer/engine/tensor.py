"""Tensor and Function: the reverse-mode automatic differentiation engine.

A ``Tensor`` wraps a NumPy or CuPy array. Every differentiable operation is a
``Function`` subclass with a ``forward`` and a ``backward`` written on raw arrays
side by side. Applying a Function to tensors that require grad records the
Function as the creator (``_ctx``) of its outputs; ``Tensor.backward`` then walks
those creators in reverse topological order, without recursion, and hands each
one the gradient of its outputs.

The walk itself is ``autograd.run_backward``; whether calls are recorded, ``grad_mode``
(``no_grad``, ``enable_grad``, ``is_grad_enabled``: re-exported here). This module defines only
the machinery. The operators (``+``, ``@``, ``sum`` ...)
live in ``tinyformer.engine.ops`` and attach themselves to ``Tensor`` on import, as
Chainer installs its arithmetic onto ``Variable``; that keeps imports one way.

Tensors are immutable from the engine's point of view: changing ``.data`` in
place after it was used by an op that saved it gives wrong gradients.
"""

import weakref

import numpy

from . import backend
from .autograd import run_backward, store_grad
from .grad_mode import GradMode, enable_grad, is_grad_enabled, no_grad

__all__ = ["Tensor", "Function", "no_grad", "enable_grad", "is_grad_enabled", "backward", "grad"]


def _as_array(data, dtype=None):
    if isinstance(data, Tensor):
        data = data.data
    if isinstance(data, numpy.ndarray) or backend.is_cupy_array(data):
        array = data
    else:
        array = numpy.asarray(data)
        if dtype is None and array.dtype == numpy.float64 and not isinstance(data, numpy.generic):
            array = array.astype(backend.DEFAULT_DTYPE)  # Python floats become float32
    if dtype is not None and array.dtype != dtype:
        array = array.astype(dtype)
    if array.dtype.kind not in "biu" and not backend.is_floating(array.dtype):
        raise TypeError(f"Tensor data must be boolean, integer or floating, got dtype {array.dtype}")
    return array


class Tensor:
    """An n-dimensional array that remembers how it was computed.

    ``data`` is a ``numpy.ndarray`` or ``cupy.ndarray``; ``grad`` is an array of
    the same type, shape and dtype once a backward pass has reached this tensor
    (leaves, and non-leaves that called ``retain_grad``), else ``None``.
    """

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "_index", "_hooks", "_post_accumulate_hooks", "_edge",
                 "__weakref__")
    __array_ufunc__ = None  # numpy defers to Tensor's reflected operators: ndarray + Tensor -> Tensor
    __hash__ = object.__hash__  # comparisons return tensors, identity stays the hash

    def __init__(self, data, requires_grad=False, dtype=None):
        self.data = _as_array(data, dtype)
        if requires_grad and not backend.is_floating(self.data.dtype):
            raise TypeError(
                f"only floating-point tensors can require grad, got dtype {self.data.dtype}"
            )
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None
        self._index = 0
        self._hooks = None
        self._post_accumulate_hooks = None
        self._edge = None

    @classmethod
    def _make(cls, data, requires_grad=False, ctx=None, index=0):
        """Fast constructor for op outputs: no validation, no conversion."""
        t = object.__new__(cls)
        t.data = data
        t.grad = None
        t.requires_grad = requires_grad
        t._ctx = ctx
        t._index = index
        t._hooks = None
        t._post_accumulate_hooks = None
        t._edge = None
        return t

    # ----------------------------------------------------------------- properties
    shape = property(lambda self: self.data.shape)
    ndim = property(lambda self: self.data.ndim)
    dtype = property(lambda self: self.data.dtype)
    size = property(lambda self: self.data.size)
    device = property(lambda self: backend.device_of(self.data))
    is_leaf = property(lambda self: self._ctx is None, doc="True unless created by a recorded op.")
    grad_fn = property(lambda self: self._ctx, doc="The Function that created this tensor, or None.")

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        body = numpy.array2string(backend.to_numpy(self.data), separator=", ", prefix="Tensor(")
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self.device != "cpu":
            extra += f", device='{self.device}'"
        return f"Tensor({body}, dtype={self.dtype}{extra})"

    def __bool__(self):
        backend.check_not_capturing("bool(Tensor) reads a value back to the host")
        return bool(self.data)

    # ----------------------------------------------------------------- conversions
    def numpy(self):
        """The values as a NumPy array (the same memory on the CPU, a copy from the GPU)."""
        return backend.to_numpy(self.data)

    def item(self):
        backend.check_not_capturing("Tensor.item() reads a value back to the host")
        if self.data.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.data.item()

    def detach(self):
        """A new leaf sharing this tensor's data, cut from the graph."""
        return Tensor._make(self.data)

    def to(self, device):
        """This tensor on ``device`` ("cpu" or "cuda"); differentiable, no copy if already there."""
        backend.check_device(device)
        if device == self.device:
            return self
        return ToDevice.apply(self, device=device)

    def zero_grad(self):
        self.grad = None

    # ----------------------------------------------------------------- autograd
    def retain_grad(self):
        """Keep ``.grad`` on this non-leaf tensor after backward (leaves always keep it)."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad() on a tensor that does not require grad")
        if self._ctx is not None and not any(
            isinstance(h, _RetainGrad) for h in self._ctx.hooks_for(self._index)
        ):
            self._ctx.hooks_for(self._index).append(_RetainGrad(self))
        return self

    def register_hook(self, hook):
        """Call ``hook(grad)`` with the gradient of this tensor once it is complete.

        ``grad`` is a raw array; a hook may return a replacement array (same shape)
        or None to keep it. Returns a handle whose ``remove()`` unregisters the hook.
        """
        if not self.requires_grad:
            raise RuntimeError("register_hook() on a tensor that does not require grad")
        if self._ctx is None:
            if self._hooks is None:
                self._hooks = []
            hooks = self._hooks
        else:
            hooks = self._ctx.hooks_for(self._index)
        hook = _ArrayHook(hook)
        hooks.append(hook)
        return _HookHandle(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Call ``hook(tensor)`` on this leaf as soon as a backward pass has added its whole
        gradient into ``.grad``, while the rest of the pass goes on (as PyTorch's hook of that
        name): data-parallel training starts all-reducing a bucket of gradients there.

        Not called by ``tinyformer.grad`` (which stores no ``.grad``) nor when no gradient
        reached the tensor. Returns a handle whose ``remove()`` unregisters the hook.
        """
        if self._ctx is not None or not self.requires_grad:
            raise RuntimeError("register_post_accumulate_grad_hook() needs a leaf tensor that requires grad")
        if self._post_accumulate_hooks is None:
            self._post_accumulate_hooks = []
        self._post_accumulate_hooks.append(hook)
        return _HookHandle(self._post_accumulate_hooks, hook)

    def backward(self, grad=None, retain_graph=False):
        """Accumulate d(self)/d(leaf) · grad into every leaf's ``.grad``.

        ``grad`` defaults to 1 for a one-element tensor and is required otherwise.
        The graph is freed afterwards unless ``retain_graph=True``.
        """
        backward([self], None if grad is None else [grad], retain_graph=retain_graph)


class _HookHandle:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


class _ArrayHook:
    """A hook of ``register_hook`` whose replacement gradient reaches the backward pass as an array
    (a returned Tensor is unwrapped)."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, grad):
        replaced = self.hook(grad)
        return replaced.data if isinstance(replaced, Tensor) else replaced


class _RetainGrad:
    """A hook that stores the gradient on a non-leaf tensor (held weakly: no cycle)."""

    def __init__(self, tensor):
        self._ref = weakref.ref(tensor)

    def __call__(self, grad):
        tensor = self._ref()
        if tensor is not None:
            store_grad(tensor, grad)


class Edge:
    """What the graph keeps of a Function's input that is not a leaf requiring grad: where its
    gradient goes (its creator ``grad_fn`` and output index), its shape and dtype, not its values.

    So an intermediate array lives only as long as a Function saved it for backward (or the user
    holds its tensor), as in PyTorch: a reshape, a residual sum or a packing of rows whose backward
    needs no values keeps none. One Edge per tensor (``Tensor._edge``), so a tensor used twice is one
    node; ``is_array`` marks an array passed to a Function as such (a mask, ids), not as a Tensor.
    """

    __slots__ = ("_ctx", "_index", "shape", "dtype", "requires_grad", "is_array")

    def __init__(self, ctx, index, shape, dtype, requires_grad, is_array=False):
        self._ctx, self._index, self.shape, self.dtype = ctx, index, tuple(shape), dtype
        self.requires_grad, self.is_array = requires_grad, is_array

    grad_fn = property(lambda self: self._ctx, doc="The Function that created the tensor, or None.")


def _graph_input(x):
    """What a recorded Function keeps of input ``x``: a leaf that requires grad itself (its ``.grad``
    is filled), any other tensor or array as its ``Edge``, a Python value as it is."""
    if isinstance(x, Tensor):
        if x._ctx is None and x.requires_grad:
            return x
        edge = x._edge
        if edge is None:
            edge = x._edge = Edge(x._ctx, x._index, x.data.shape, x.data.dtype, x.requires_grad)
        return edge
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return Edge(None, 0, x.shape, x.dtype, False, is_array=True)
    return x


class Function:
    """A node of the graph: ``forward`` and ``backward`` on raw arrays.

    Subclasses implement ``forward(*arrays, **params)``, returning an array (or a
    tuple of arrays), and ``backward(*grad_outputs)``, returning one gradient per
    positional input (``None`` where there is none), each of that input's shape.
    With several outputs, those no gradient reached arrive as zeros, or as ``None``
    when the subclass sets ``materialize_grads = False`` (saving the work).
    ``forward`` stores on ``self`` what ``backward`` needs; ``self.needs_input_grad``
    tells which inputs want a gradient, so work for constants can be skipped.
    Inputs that are not Tensors (Python scalars) are passed through as they are.
    """

    inputs = None  # set when the call is recorded (leaves that require grad, else Edges); None once freed
    needs_input_grad = ()
    materialize_grads = True  # False: outputs no gradient reached arrive as None, not zeros
    # Set by the engine before each backward: False means the Function is released right
    # after, so its backward may reuse (overwrite) what it saved instead of copying it.
    retain_graph = True
    # True: the engine sets ``grad_targets`` before each backward (autograd.GradTarget: inputs whose
    # gradient the backward may add into a leaf's .grad itself, returning None there); () otherwise.
    accepts_grad_targets = False
    grad_targets = ()
    # True: backward returns its output's gradient for input 0 unchanged but for the dtype (a
    # parameter's compute copy), so a gradient for the output may go to input 0's .grad directly.
    passes_gradient_to_input = False
    # True: every gradient backward returns is a new array no one else holds (a product's output), so the
    # engine may add later gradients of that input into it in place (autograd.GradTarget).
    fresh_input_grads = False
    _hooks = None
    _out_meta = None

    @classmethod
    def apply(cls, *inputs, **params):
        fn = cls()
        arrays, needs = [], []
        for x in inputs:
            if isinstance(x, Tensor):
                arrays.append(x.data)
                needs.append(x.requires_grad)
            else:
                arrays.append(x)
                needs.append(False)
        record = GradMode.enabled and True in needs
        fn.needs_input_grad = tuple(needs) if record else (False,) * len(needs)
        try:
            out = fn.forward(*arrays, **params)
        except ValueError as error:
            shapes = " and ".join(str(numpy.shape(a)) for a in arrays)
            raise ValueError(f"{cls.__name__}: {error} (input shapes {shapes})") from error
        if record:
            fn.inputs = tuple(_graph_input(x) for x in inputs)
        else:
            fn = None
        if type(out) is tuple:
            outs = tuple(_finish(o, fn, i) for i, o in enumerate(out))
            if fn is not None:
                fn._out_meta = [(o.shape, o.dtype) for o in outs]
            return outs
        return _finish(out, fn, 0)

    def forward(self, *arrays, **params):
        raise NotImplementedError

    def backward(self, *grad_outputs):
        raise NotImplementedError

    def hooks_for(self, index):
        if self._hooks is None:
            self._hooks = {}
        return self._hooks.setdefault(index, [])

    def release(self):
        """Drop the inputs and everything saved for backward (the graph is freed)."""
        self.__dict__.clear()

    @property
    def name(self):
        return type(self).__name__


def _finish(out, fn, index):
    if isinstance(out, numpy.generic):  # numpy reductions return scalars, not 0-d arrays
        out = numpy.asarray(out)
    if fn is None or not backend.is_floating(out.dtype):
        return Tensor._make(out)
    return Tensor._make(out, True, fn, index)


class ToDevice(Function):
    """Copy between devices; the gradient travels back to the source device."""

    def forward(self, x, device):
        self.source = backend.device_of(x)
        return backend.to_device(x, device)

    def backward(self, grad):
        """d to(x)/dx = I: the gradient, moved back to x's device."""
        return backend.to_device(grad, self.source)


# ------------------------------------------------------------------- the entry points of the backward pass
def _as_grad_array(grad, tensor):
    g = grad.data if isinstance(grad, Tensor) else grad
    xp = backend.get_array_module(tensor.data)
    g = xp.asarray(g, dtype=tensor.dtype)
    if g.shape != tensor.shape:
        raise ValueError(f"backward: grad has shape {g.shape} but the tensor has shape {tensor.shape}")
    return g


def _prepare_roots(tensors, grads):
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, Tensor):
            raise TypeError(f"backward needs Tensors, got {type(t).__name__}")
        if not t.requires_grad:
            raise RuntimeError(
                "backward from a tensor that does not require grad: no input of the "
                "computation had requires_grad=True (or it ran under no_grad())"
            )
    if grads is None:
        grads = [None] * len(tensors)
    grads = list(grads)
    if len(grads) != len(tensors):
        raise ValueError(f"backward: {len(tensors)} tensors but {len(grads)} gradients")
    arrays = []
    for t, g in zip(tensors, grads):
        if g is None:
            if t.data.size != 1:
                raise RuntimeError(
                    f"backward: grad must be given for a tensor of shape {t.shape}; "
                    "it defaults to 1 only for one-element tensors"
                )
            g = backend.get_array_module(t.data).ones_like(t.data)
        arrays.append(_as_grad_array(g, t))
    return tensors, arrays


def backward(tensors, grads=None, retain_graph=False):
    """Backpropagate from several tensors at once, accumulating into leaves' ``.grad``."""
    tensors, arrays = _prepare_roots(tensors, grads)
    run_backward(tensors, arrays, retain_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=False):
    """Gradients of ``outputs`` with respect to ``inputs``, returned instead of stored.

    Like ``torch.autograd.grad``: no ``.grad`` is touched. Returns one array per
    input, zeros where an input does not influence the outputs.
    """
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    if grad_outputs is not None and not isinstance(grad_outputs, (list, tuple)):
        grad_outputs = [grad_outputs]
    inputs = list(inputs)
    for t in inputs:
        if not isinstance(t, Tensor) or not t.requires_grad:
            raise ValueError("grad: every input must be a Tensor with requires_grad=True")
    outputs, arrays = _prepare_roots(outputs, grad_outputs)
    captured = run_backward(outputs, arrays, retain_graph, capture=inputs)
    results = []
    for t in inputs:
        g = captured.get(id(t))
        if g is None:
            g = backend.get_array_module(t.data).zeros_like(t.data)
        results.append(g)
    return results
