"""Layer normalisation over the last axis; kernels/layer_norm.cu on the GPU."""

import numpy

from .. import amp, backend, kernels
from ..kernels import layer_norm as layer_norm_kernel
from ...common.validation import check_real
from ._dispatch import KernelFunction
from ._targets import target_array

_xp = backend.get_array_module


class LayerNorm(KernelFunction):
    """y = x̂ ∘ w + b with x̂ = (x − μ) / √(σ² + eps) over the last axis (biased σ²).

    With r = 1/√(σ² + eps) and dx̂ = dy ∘ w, over the n features:
    dx = r · (dx̂ − mean(dx̂) − x̂ ∘ mean(dx̂ ∘ x̂));  dw = Σ dy ∘ x̂;  db = Σ dy
    (the last two summed over every axis but the last). dw and db are added straight into the
    parameters' gradients where the engine offers them (``grad_targets``; on the GPU by the one launch
    that sums the backward's per-chunk partials), and None is returned for them.
    """

    accepts_grad_targets = fresh_input_grads = True

    def check_forward(self, x, weight, bias, eps):
        n = x.shape[-1]
        if weight.shape != (n,) or bias.shape != (n,):
            raise ValueError(
                f"weight and bias must have shape ({n},) for {n} features, "
                f"got {weight.shape} and {bias.shape}"
            )

    def kernel_applies(self, x, weight, bias, eps):
        return kernels.use_kernels(x, weight, bias) and x.dtype == weight.dtype == bias.dtype

    def forward_reference(self, x, weight, bias, eps):
        self.weight = weight
        n = x.shape[-1]
        xp = _xp(x)
        rows = x.reshape(-1, n)
        xhat = xp.empty_like(rows)
        y = xp.empty(rows.shape, dtype=xp.result_type(x, weight, bias))
        rstd = xp.empty((len(rows), 1), dtype=x.dtype)

        def normalize(start, stop):  # rows [start, stop): x̂, r and y, in row blocks on several threads
            z, block = rows[start:stop], xhat[start:stop]
            with numpy.errstate(over="ignore", invalid="ignore"):
                xp.subtract(z, z.mean(axis=-1, keepdims=True), out=block)
                var = xp.einsum("ri,ri->r", block, block)[:, None] / n  # Σ (x − μ)², no temporary
                rstd[start:stop] = 1.0 / xp.sqrt(var + eps)
                block *= rstd[start:stop]
            overflowed = ~xp.isfinite(var[:, 0])
            if bool(overflowed.any()):
                block[overflowed], rstd[start:stop][overflowed] = _rescaled_rows(xp, z[overflowed], eps)
            xp.multiply(block, weight, out=y[start:stop])
            y[start:stop] += bias

        backend.map_row_blocks(normalize, len(rows), x, row_size=n, cache_sized=True)
        self.xhat, self.rstd = xhat.reshape(x.shape), rstd.reshape(x.shape[:-1] + (1,))
        return y.reshape(x.shape)

    def backward_reference(self, g):
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
        targets = param_targets(self.grad_targets, 1, g.dtype)
        grad_w = _summed([part[0] for part in parts], targets[0]) if need_w else None
        grad_b = _summed([part[1] for part in parts], targets[1]) if need_b else None
        return (None if grad_x is None else grad_x.reshape(g.shape)), grad_w, grad_b, None

    def forward_kernel(self, x, weight, bias, eps):
        """kernels/layer_norm.cu keeps μ and r per row instead of x̂."""
        self.x, self.weight = x, weight
        y, self.mean, self.rstd = layer_norm_kernel.layer_norm_forward(x, weight, bias, eps)
        return y

    def backward_kernel(self, g):
        target_w, target_b = param_targets(self.grad_targets, 1, self.x.dtype)
        grad_x, grad_w, grad_b = layer_norm_kernel.layer_norm_backward(
            self.x, self.weight, g.astype(self.x.dtype, copy=False), self.mean, self.rstd,
            need_input=self.needs_input_grad[0], need_params=any(self.needs_input_grad[1:3]),
            grad_weight=target_w, grad_bias=target_b)
        return grad_x, (None if target_w is not None else grad_w), (None if target_b is not None else grad_b), None


def param_targets(targets, first, dtype):
    """The arrays to add dw and db into: of the ``grad_targets`` (autograd.GradTarget) of the weight
    and bias, inputs ``first`` and ``first + 1``, each one offered of ``dtype`` and contiguous (what
    the kernel writes); None for the others, whose gradients are returned."""
    return tuple(target_array(target, dtype) for target in (tuple(targets) + (None,) * (first + 2))[first:first + 2])


def _summed(parts, target):
    """The row blocks' partial sums of dw (or db) added up, in block order: into ``target`` (returning
    None) where one is given, else into the first block's array."""
    if target is None:
        return sum(parts[1:], parts[0])
    xp = _xp(target)
    for part in parts:
        xp.add(target, part, out=target)
    return None


def _rescaled_rows(xp, rows, eps):
    """(x̂, r) of float32 rows whose mean or Σ (x − μ)² overflowed (values beyond ~1e19).

    With s = max |x| per row and u = x / s: x − μ = s · (u − mean(u)) and σ² = s² · mean((u − ū)²), so
    x̂ = (u − ū) / √(mean((u − ū)²) + eps/s²) and r = 1/√(σ² + eps) = that denominator's inverse / s:
    nothing is summed or squared before it is divided by s.
    """
    with numpy.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        scale = xp.abs(rows).max(axis=-1, keepdims=True)
        unit = rows / scale
        unit -= unit.mean(axis=-1, keepdims=True)
        spread = xp.sqrt((unit * unit).mean(axis=-1, keepdims=True) + eps / (scale * scale))
        # σ = 0 and eps/s² underflowed (a constant row of huge values): x̂ = 0 and r = 1/√eps, as
        # kernels/layer_norm.cuh does, instead of 0 · ∞
        flat = spread == 0
        r_unit = 1.0 / xp.where(flat, 1, spread)
        rstd = xp.where(flat, rows.dtype.type(1.0 / numpy.sqrt(eps)) if eps else numpy.inf, r_unit / scale)
    return unit * r_unit, rstd.astype(rows.dtype, copy=False)


def layer_norm(x, weight, bias, eps=1e-5):
    """Layer normalisation over the last axis (Ba et al., 2016), eps inside the square root."""
    if x.ndim == 0:
        raise ValueError("layer_norm: x needs a feature axis, got a 0-d tensor")
    (x,) = amp.float32_args(x)  # the statistics in float32 under amp.autocast
    return LayerNorm.apply(x, weight, bias, check_real("layer_norm: eps", eps, 0))
