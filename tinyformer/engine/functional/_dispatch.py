"""The one pattern every fused op follows to choose between its CUDA kernel and its NumPy reference."""

import numpy

from .. import backend
from ..tensor import Function


class KernelFunction(Function):
    """A fused op with two paths: ``forward_reference``/``backward_reference``, the NumPy
    reference (written on the arrays' own module, so it also runs on CuPy arrays when the kernel
    does not apply), and ``forward_kernel``/``backward_kernel``, the call into the op's CUDA kernel.

    ``forward`` checks the inputs (``check_forward``), then picks the path once:
    ``uses_kernel = kernel_applies(...)``, which is ``kernels.use_kernels`` on the op's arrays
    plus the op's own conditions. ``backward`` follows the forward's choice.

    The reference on float16 or bfloat16 inputs runs in float32 (NumPy's half arithmetic would
    round every partial sum; the kernels accumulate in float): half inputs are cast up, and the
    outputs rounded to the half type, except those listed in ``float32_outputs`` (the loss).
    The gradients reach the inputs in their own dtypes (the engine casts them).

    Both paths' outputs pass through ``backend.captured_memory``: inside a CUDA graph capture
    whose memory is not CuPy's (the kernels emulated on NumPy arrays) they become memory of the
    captured step (``backend.capturing``'s ``memory``), so that what the step does with them is
    that memory's work too; otherwise they are returned as they are.
    """

    float32_outputs = ()

    def forward(self, *args, **params):
        self.check_forward(*args, **params)
        self.uses_kernel = bool(self.kernel_applies(*args, **params))
        if self.uses_kernel:
            return backend.captured_memory(self.forward_kernel(*args, **params))
        half = next((a.dtype for a in args if hasattr(a, "dtype") and backend.is_half(a.dtype)), None)
        if half is None:
            return backend.captured_memory(self.forward_reference(*args, **params))
        out = self.forward_reference(*(_float32(a) for a in args), **params)
        if type(out) is tuple:
            out = tuple(o if i in self.float32_outputs else _round(o, half) for i, o in enumerate(out))
        else:
            out = out if 0 in self.float32_outputs else _round(out, half)
        return backend.captured_memory(out)

    def backward(self, *grad_outputs):
        if self.uses_kernel:
            return backend.captured_memory(self.backward_kernel(*grad_outputs))
        return backend.captured_memory(self.backward_reference(*(_float32(g) for g in grad_outputs)))

    def check_forward(self, *args, **params):
        """Raise on inputs that neither path takes (Chainer's ``check_type_forward``); none by default."""

    def kernel_applies(self, *args, **params):
        """Whether the CUDA kernel runs this call: ``use_kernels(arrays)`` and the op's own conditions.
        What it works out for the kernel on the way (attention: the key lengths) it may keep on ``self``."""
        raise NotImplementedError

    def forward_reference(self, *args, **params):
        raise NotImplementedError

    def forward_kernel(self, *args, **params):
        raise NotImplementedError

    def backward_reference(self, *grad_outputs):
        raise NotImplementedError

    def backward_kernel(self, *grad_outputs):
        raise NotImplementedError


def _float32(array):
    """A half-precision array as float32; anything else as it is."""
    return backend.cast(array, numpy.float32) if hasattr(array, "dtype") and backend.is_half(array.dtype) else array


def _round(array, dtype):
    """A floating result rounded to the half type of the inputs; others (masks, None) as they are."""
    if hasattr(array, "dtype") and backend.is_floating(array.dtype) and array.dtype != dtype:
        return backend.cast(array, dtype)
    return array
