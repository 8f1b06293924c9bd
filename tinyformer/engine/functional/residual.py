"""The post-LN sublayer connection, LayerNorm(x + Dropout(y)) (§5.4), as one node;
kernels/residual_layer_norm.cu on the GPU."""

import numpy

from .. import amp, backend, kernels
from ..kernels import residual_layer_norm as residual_layer_norm_kernel
from ...common.validation import check_probability, check_real
from ._dispatch import KernelFunction
from ..random import kernel_seed
from .dropout import _check_generator, _dropped, _scale, _scaled_by_mask
from .layer_norm import LayerNorm, param_targets


class ResidualDropoutLayerNorm(KernelFunction):
    """out = layer_norm(h), h = x + y ∘ m / (1 − p) (m the dropout mask; m = 1 when p = 0).

    Backward, with dh layer norm's input gradient (``LayerNorm``): dx = dh, dy = dh ∘ m / (1 − p);
    dw and db are layer norm's, on h. The same values, mask and generator draws as
    ``layer_norm(x + dropout(y, p), w, b)``, in one node instead of three (on the GPU one kernel
    each way instead of three launches). The mask comes from ``generator`` as ``dropout`` draws it:
    on the host for the reference, a Philox seed for the kernel (kernels/residual_layer_norm.cu,
    the mask of kernels/dropout.cu for that seed).

    y may be float16 or bfloat16 where x and the parameters are float32 (autocast's sublayer output):
    then the output is float32, y is read as float32 (the kernel reads the half values itself) and dy
    is y's type, without cast nodes. dw and db go straight into the parameters' gradients where the
    engine offers them (``grad_targets``), as ``LayerNorm``'s do.
    """

    accepts_grad_targets = True

    @property
    def fresh_input_grads(self):
        """The kernel's dx and dy are new arrays of their own (the reference may hand dh to both)."""
        return getattr(self, "uses_kernel", False)

    def check_forward(self, x, y, weight, bias, p, generator, eps):
        if x.shape != y.shape:
            raise ValueError(f"residual_dropout_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
        LayerNorm.check_forward(self, x, weight, bias, eps)

    def forward(self, x, y, weight, bias, p, generator, eps):
        if _mixed(x, y, weight, bias):  # not KernelFunction's half path: float32 math and outputs, y as float32
            self.check_forward(x, y, weight, bias, p, generator, eps)
            self.uses_kernel = bool(self.kernel_applies(x, y, weight, bias, p, generator, eps))
            if not self.uses_kernel:
                y = backend.cast(y, numpy.float32)
                return backend.captured_memory(self.forward_reference(x, y, weight, bias, p, generator, eps))
            return backend.captured_memory(self.forward_kernel(x, y, weight, bias, p, generator, eps))
        return super().forward(x, y, weight, bias, p, generator, eps)

    def kernel_applies(self, x, y, weight, bias, p, generator, eps):
        return kernels.use_kernels(x, y, weight, bias) and x.dtype == weight.dtype == bias.dtype \
            and (y.dtype == x.dtype or _mixed(x, y, weight, bias))

    def forward_reference(self, x, y, weight, bias, p, generator, eps):
        self.p = p
        if p:
            self.scale = _scale(y, p)
            y, self.keep = _dropped(y, p, generator)
        self.norm = LayerNorm()
        self.norm.needs_input_grad = (any(self.needs_input_grad[:2]),) + tuple(self.needs_input_grad[2:4]) + (False,)
        return self.norm.forward_reference(x + y, weight, bias, eps)

    def backward_reference(self, g):
        self.norm.grad_targets = (None,) + tuple(self.grad_targets[2:4])
        grad_h, grad_w, grad_b, _ = self.norm.backward_reference(g)
        self.norm.grad_targets = ()
        grad_y = None
        if self.needs_input_grad[1] and grad_h is not None:
            grad_y = _scaled_by_mask(grad_h, self.keep, self.scale) if self.p else grad_h
        return (grad_h if self.needs_input_grad[0] else None), grad_y, grad_w, grad_b, None, None, None

    def forward_kernel(self, x, y, weight, bias, p, generator, eps):
        self.weight, self.y_dtype = weight, y.dtype
        self.scale = float(_scale(x, p)) if p else 1.0  # in x's type: float32 where y is half (mixed)
        out, self.h, self.keep, self.mean, self.rstd = residual_layer_norm_kernel.residual_layer_norm_forward(
            x, y, weight, bias, p, kernel_seed(generator) if p else 0, scale=self.scale, eps=eps)
        return out

    def backward_kernel(self, g):
        target_w, target_b = param_targets(self.grad_targets, 2, self.h.dtype)
        grad_x, grad_y, grad_w, grad_b = residual_layer_norm_kernel.residual_layer_norm_backward(
            self.h, self.weight, g.astype(self.h.dtype, copy=False), self.mean, self.rstd, self.keep, self.scale,
            need_params=any(self.needs_input_grad[2:4]), grad_y_dtype=self.y_dtype,
            grad_weight=target_w, grad_bias=target_b)
        return (grad_x, grad_y, None if target_w is not None else grad_w, None if target_b is not None else grad_b,
                None, None, None)


def _mixed(x, y, weight, bias):
    """x and the parameters float32, y half: autocast's sublayer output beside the float32 residual stream."""
    return x.dtype == weight.dtype == bias.dtype == numpy.float32 and backend.is_half(y.dtype)


def residual_dropout_layer_norm(x, y, weight, bias, p=0.0, training=True, generator=None, eps=1e-5):
    """layer_norm(x + dropout(y, p, training, generator), weight, bias, eps) as one op: the
    post-LN residual connection of §5.4, x the sublayer's input and y its output; in float32
    under ``amp.autocast`` (layer norm's statistics, and the residual stream, stay float32)."""
    p = check_probability("residual_dropout_layer_norm: p", p)
    _check_generator(generator, "residual_dropout_layer_norm: generator")
    if x.ndim == 0:
        raise ValueError("residual_dropout_layer_norm: x needs a feature axis, got a 0-d tensor")
    (x,) = amp.float32_args(x)  # the residual stream in float32 under autocast; a half y is read as it is
    return ResidualDropoutLayerNorm.apply(x, y, weight, bias, p if training else 0.0, generator,
                                          eps=check_real("residual_dropout_layer_norm: eps", eps, 0))
