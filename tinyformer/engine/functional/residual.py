"""The post-LN sublayer connection, LayerNorm(x + Dropout(y + y_bias)) (§5.4), as one node;
kernels/residual_layer_norm.cu on the GPU."""

import numpy

from .. import amp, backend, kernels
from ..kernels import residual_layer_norm as residual_layer_norm_kernel
from ...common.validation import check_probability, check_real
from ._dispatch import KernelFunction
from ..random import kernel_seed
from .dropout import _check_generator, _dropped, _scale, _scaled_by_mask
from ._targets import target_array
from .layer_norm import LayerNorm, param_targets


class ResidualDropoutLayerNorm(KernelFunction):
    """out = layer_norm(h), h = x + (y + y_bias) ∘ m / (1 − p) (m the dropout mask; m = 1 when p = 0;
    y_bias, the sublayer's output bias over the last axis, optional).

    Backward, with dh layer norm's input gradient (``LayerNorm``): dx = dh, dy = dh ∘ m / (1 − p),
    d(y_bias) = Σ_rows dy; dw and db are layer norm's, on h. The same values, mask and generator draws
    as ``layer_norm(x + dropout(y + y_bias, p), w, b)``, in one node instead of four (on the GPU one kernel
    each way instead of four launches: d(y_bias) is summed beside dw and db). The mask comes from
    ``generator`` as ``dropout`` draws it:
    on the host for the reference, a Philox seed for the kernel (kernels/residual_layer_norm.cu,
    the mask of kernels/dropout.cu for that seed).

    y may be float16 or bfloat16 where x, the parameters and y_bias are float32 (autocast's sublayer
    output): then the output is float32, y is read as float32 (the kernel reads the half values itself)
    and dy is y's type, without cast nodes. dw, db and d(y_bias) go straight into the parameters'
    gradients where the engine offers them (``grad_targets``), as ``LayerNorm``'s do.
    """

    accepts_grad_targets = True

    @property
    def fresh_input_grads(self):
        """The kernel's dx and dy are new arrays of their own (the reference may hand dh to both)."""
        return getattr(self, "uses_kernel", False)

    def check_forward(self, x, y, weight, bias, y_bias, p, generator, eps):
        if x.shape != y.shape:
            raise ValueError(f"residual_dropout_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
        LayerNorm.check_forward(self, x, weight, bias, eps)
        if y_bias is not None and y_bias.shape != x.shape[-1:]:
            raise ValueError(f"residual_dropout_layer_norm: y_bias must have shape ({x.shape[-1]},) for "
                             f"{x.shape[-1]} features, got {y_bias.shape}")

    def forward(self, x, y, weight, bias, y_bias, p, generator, eps):
        args = (x, y, weight, bias, y_bias, p, generator, eps)
        if _mixed(x, y, weight, bias, y_bias):  # not KernelFunction's half path: float32 math and outputs
            self.check_forward(*args)
            self.uses_kernel = bool(self.kernel_applies(*args))
            if not self.uses_kernel:
                y = backend.cast(y, numpy.float32)
                return backend.captured_memory(self.forward_reference(x, y, weight, bias, y_bias, p, generator, eps))
            return backend.captured_memory(self.forward_kernel(*args))
        return super().forward(*args)

    def kernel_applies(self, x, y, weight, bias, y_bias, p, generator, eps):
        return kernels.use_kernels(x, y, weight, bias, *([] if y_bias is None else [y_bias])) \
            and x.dtype == weight.dtype == bias.dtype and (y_bias is None or y_bias.dtype == x.dtype) \
            and (y.dtype == x.dtype or _mixed(x, y, weight, bias, y_bias))

    def forward_reference(self, x, y, weight, bias, y_bias, p, generator, eps):
        self.p = p
        if y_bias is not None:
            y = y + y_bias
        if p:
            self.scale = _scale(y, p)
            y, self.keep = _dropped(y, p, generator)
        self.norm = LayerNorm()
        needs = self.needs_input_grad
        self.norm.needs_input_grad = (needs[0] or needs[1] or needs[4],) + tuple(needs[2:4]) + (False,)
        return self.norm.forward_reference(x + y, weight, bias, eps)

    def backward_reference(self, g):
        self.norm.grad_targets = (None,) + tuple(self.grad_targets[2:4])
        grad_h, grad_w, grad_b, _ = self.norm.backward_reference(g)
        self.norm.grad_targets = ()
        needs = self.needs_input_grad
        grad_y = grad_y_bias = None
        if (needs[1] or needs[4]) and grad_h is not None:
            grad_y = _scaled_by_mask(grad_h, self.keep, self.scale) if self.p else grad_h
        if needs[4] and grad_y is not None:
            grad_y_bias = _column_sum(grad_y, (tuple(self.grad_targets) + (None,) * 5)[4])
        return (grad_h if needs[0] else None), (grad_y if needs[1] else None), grad_w, grad_b, grad_y_bias, None, None

    def forward_kernel(self, x, y, weight, bias, y_bias, p, generator, eps):
        self.weight, self.y_dtype = weight, y.dtype
        self.scale = float(_scale(x, p)) if p else 1.0  # in x's type: float32 where y is half (mixed)
        out, self.h, self.keep, self.mean, self.rstd = residual_layer_norm_kernel.residual_layer_norm_forward(
            x, y, weight, bias, p, kernel_seed(generator) if p else 0, scale=self.scale, eps=eps, y_bias=y_bias)
        return out

    def backward_kernel(self, g):
        target_w, target_b = param_targets(self.grad_targets, 2, self.h.dtype)
        need_y_bias = bool(self.needs_input_grad[4])
        target_y_bias = target_array((tuple(self.grad_targets) + (None,) * 5)[4], self.h.dtype) if need_y_bias else None
        grad_x, grad_y, grad_w, grad_b, *grad_y_bias = residual_layer_norm_kernel.residual_layer_norm_backward(
            self.h, self.weight, g.astype(self.h.dtype, copy=False), self.mean, self.rstd, self.keep, self.scale,
            need_params=any(self.needs_input_grad[2:4]), grad_y_dtype=self.y_dtype,
            grad_weight=target_w, grad_bias=target_b, need_y_bias=need_y_bias, grad_y_bias=target_y_bias)
        grad_y_bias = grad_y_bias[0] if need_y_bias and target_y_bias is None else None
        return (grad_x, grad_y, None if target_w is not None else grad_w, None if target_b is not None else grad_b,
                grad_y_bias, None, None)


def _mixed(x, y, weight, bias, y_bias=None):
    """x, the parameters and y_bias float32, y half: autocast's sublayer output beside the float32
    residual stream."""
    return x.dtype == weight.dtype == bias.dtype == numpy.float32 and backend.is_half(y.dtype) \
        and (y_bias is None or y_bias.dtype == numpy.float32)


def _column_sum(grad_y, target):
    """d(y_bias) = Σ over every axis but the last of grad_y: added into ``target`` (an
    autograd.GradTarget, returning None) where it offers an array of its type, else returned."""
    sums = grad_y.reshape(-1, grad_y.shape[-1]).sum(axis=0)
    array = target_array(target, sums.dtype)
    if array is None:
        return sums
    backend.get_array_module(array).add(array, sums, out=array)
    return None


def residual_dropout_layer_norm(x, y, weight, bias, p=0.0, training=True, generator=None, eps=1e-5, y_bias=None):
    """layer_norm(x + dropout(y + y_bias, p, training, generator), weight, bias, eps) as one op: the
    post-LN residual connection of §5.4, x the sublayer's input, y its output and ``y_bias`` (None:
    none) the bias its last linear layer left for this op to add (no launch of its own, either way);
    in float32 under ``amp.autocast`` (layer norm's statistics, the residual stream and y_bias stay
    float32)."""
    p = check_probability("residual_dropout_layer_norm: p", p)
    _check_generator(generator, "residual_dropout_layer_norm: generator")
    if x.ndim == 0:
        raise ValueError("residual_dropout_layer_norm: x needs a feature axis, got a 0-d tensor")
    x, y_bias = amp.float32_args(x, y_bias)  # the residual stream in float32 under autocast; a half y as it is
    return ResidualDropoutLayerNorm.apply(x, y, weight, bias, y_bias, p if training else 0.0, generator,
                                          eps=check_real("residual_dropout_layer_norm: eps", eps, 0))
