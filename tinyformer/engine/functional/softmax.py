"""Softmax and log-softmax along one axis; the last axis runs through kernels/softmax.cu on the GPU."""

from .. import amp, backend, kernels
from ..kernels import softmax as softmax_kernel
from ..ops._helpers import normalize_axes
from ...common.validation import is_integer
from ._dispatch import KernelFunction

_xp = backend.get_array_module


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


def _stable_softmax(x, axis):
    """exp(x - max) / Σ exp(x - max): the max shift keeps exp finite for any finite x."""
    e = _xp(x).exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class _RowSoftmax(KernelFunction):
    """What softmax and log-softmax share: one axis, checked first; the kernel runs on the last axis."""

    def check_forward(self, x, axis):
        self.axis = _axis(axis, x.shape)

    def kernel_applies(self, x, axis):
        return kernels.use_kernels(x) and self.axis == x.ndim - 1


class Softmax(_RowSoftmax):
    """pᵢ = exp(xᵢ) / Σⱼ exp(xⱼ);  dx = p ∘ (dp − Σⱼ dpⱼ pⱼ)."""

    def forward_reference(self, x, axis):
        self.p = _stable_softmax(x, self.axis)
        return self.p

    def backward_reference(self, g):
        p = self.p
        return p * (g - (g * p).sum(axis=self.axis, keepdims=True))

    def forward_kernel(self, x, axis):
        self.p = softmax_kernel.softmax_forward(x)
        return self.p

    def backward_kernel(self, g):
        return softmax_kernel.softmax_backward(self.p, g.astype(self.p.dtype, copy=False))


class LogSoftmax(_RowSoftmax):
    """yᵢ = xᵢ − max − log Σⱼ exp(xⱼ − max);  dx = dy − softmax(x) · Σⱼ dyⱼ."""

    def forward_reference(self, x, axis):
        xp, axis = _xp(x), self.axis
        shifted = x - x.max(axis=axis, keepdims=True)
        self.y = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))
        return self.y

    def backward_reference(self, g):
        return g - _xp(g).exp(self.y) * g.sum(axis=self.axis, keepdims=True)

    def forward_kernel(self, x, axis):
        self.y = softmax_kernel.softmax_forward(x, log=True)
        return self.y

    def backward_kernel(self, g):
        return softmax_kernel.softmax_backward(self.y, g.astype(self.y.dtype, copy=False), log=True)


def softmax(x, axis=-1):
    """Softmax along ``axis``, max-subtracted (finite for |x| up to float range); float32 under ``amp.autocast``."""
    (x,) = amp.float32_args(x)
    return Softmax.apply(x, axis=axis)


def log_softmax(x, axis=-1):
    """log(softmax(x)) along ``axis``, computed without forming softmax (no log(0)); float32 under ``amp.autocast``."""
    (x,) = amp.float32_args(x)
    return LogSoftmax.apply(x, axis=axis)
