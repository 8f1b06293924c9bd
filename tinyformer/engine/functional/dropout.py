"""Inverted dropout (§5.4); on the GPU the mask comes from Philox in kernels/dropout.cu."""

import numpy

from .. import backend, kernels
from ..kernels import dropout as dropout_kernel
from ..random import fill_keep_mask, kernel_seed
from ...common.validation import check_probability
from ._dispatch import KernelFunction

_xp = backend.get_array_module


class Dropout(KernelFunction):
    """Inverted dropout: y = x ∘ m / (1 − p), m = [s ≥ t] with P(m = 0) = p;  dx = dy ∘ m / (1 − p).

    The mask is drawn from ``generator`` on the host (``random.fill_keep_mask``: 16-bit samples s,
    t = p·2¹⁶ rounded; copied to the device for other arrays), or, where the kernel runs
    (``kernels.use_kernels``), from Philox on the device (kernels/dropout.cu), keyed by a seed
    drawn from ``generator``: no host draw, no copy. Both repeat for a seed; their masks differ.
    Both keep the boolean mask, so the backward is the same on both paths.
    """

    def kernel_applies(self, x, p, generator):
        return kernels.use_kernels(x)

    def forward_reference(self, x, p, generator):
        self.scale = _scale(x, p)
        y, self.keep = _dropped(x, p, generator)
        return y

    def forward_kernel(self, x, p, generator):
        self.scale = _scale(x, p)
        y, self.keep = dropout_kernel.dropout_forward(x, p, kernel_seed(generator), scale=float(self.scale))
        return y

    def backward_reference(self, g):
        return _scaled_by_mask(g, self.keep, self.scale)

    backward_kernel = backward_reference


def _scale(x, p):
    """1/(1 − p) as a scalar of x's dtype (a NumPy scalar: CuPy takes it, not a 0-d array)."""
    return x.dtype.type(1.0 / (1.0 - p))


def _scaled_by_mask(x, keep, scale):
    """x ∘ keep · scale in one new array, in element blocks on several threads when large."""
    xp = _xp(x)
    flat_x, flat_keep = xp.ascontiguousarray(x).reshape(-1), keep.reshape(-1)
    out = xp.empty(flat_x.shape, dtype=xp.result_type(x, scale))

    def block(start, stop):
        xp.multiply(flat_x[start:stop], flat_keep[start:stop], out=out[start:stop])
        out[start:stop] *= scale

    backend.map_row_blocks(block, flat_x.size, x, cache_sized=True)
    return out.reshape(x.shape)


def _dropped(x, p, generator, out=None):
    """(x ∘ keep / (1 − p), keep) with keep the boolean mask (1 byte per element) of one
    ``fill_keep_mask`` draw from ``generator``. For NumPy x, mask and output are made block by
    block as the mask comes (several threads), into ``out`` if given (x itself, for a node that
    owns x); other arrays take the mask drawn on the host."""
    scale = _scale(x, p)
    if _xp(x) is not numpy:
        keep = backend.like(_keep_mask_on_cpu(x.shape, p, generator), x)
        return _scaled_by_mask(x, keep, scale), keep
    flat_x = numpy.ascontiguousarray(x).reshape(-1)
    keep = numpy.empty(flat_x.shape, dtype=bool)
    out = numpy.empty(flat_x.shape, dtype=x.dtype) if out is None else out.reshape(-1)

    def block(start, stop):
        numpy.multiply(flat_x[start:stop], keep[start:stop], out=out[start:stop])
        out[start:stop] *= scale

    fill_keep_mask(generator, p, keep, block)
    return out.reshape(x.shape), keep.reshape(x.shape)


def _keep_mask_on_cpu(shape, p, generator):
    """The keep mask of ``shape`` for dropout probability ``p``: one ``fill_keep_mask`` draw."""
    keep = numpy.empty(shape, dtype=bool)
    fill_keep_mask(generator, p, keep.reshape(-1))
    return keep


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
