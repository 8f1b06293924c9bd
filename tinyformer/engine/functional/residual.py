"""The post-LN sublayer connection, LayerNorm(x + Dropout(y)) (§5.4), as one node;
kernels/residual_layer_norm.cu on the GPU."""

from .. import amp, kernels
from ..kernels import residual_layer_norm as residual_layer_norm_kernel
from ...common.validation import check_probability, check_real
from ._dispatch import KernelFunction
from ..random import kernel_seed
from .dropout import _check_generator, _dropped, _scale, _scaled_by_mask
from .layer_norm import LayerNorm


class ResidualDropoutLayerNorm(KernelFunction):
    """out = layer_norm(h), h = x + y ∘ m / (1 − p) (m the dropout mask; m = 1 when p = 0).

    Backward, with dh layer norm's input gradient (``LayerNorm``): dx = dh, dy = dh ∘ m / (1 − p);
    dw and db are layer norm's, on h. The same values, mask and generator draws as
    ``layer_norm(x + dropout(y, p), w, b)``, in one node instead of three (on the GPU one kernel
    each way instead of three launches). The mask comes from ``generator`` as ``dropout`` draws it:
    on the host for the reference, a Philox seed for the kernel (kernels/residual_layer_norm.cu,
    the mask of kernels/dropout.cu for that seed).
    """

    @property
    def fresh_input_grads(self):
        """The kernel's dx and dy are new arrays of their own (the reference may hand dh to both)."""
        return getattr(self, "uses_kernel", False)

    def check_forward(self, x, y, weight, bias, p, generator, eps):
        if x.shape != y.shape:
            raise ValueError(f"residual_dropout_layer_norm: x {x.shape} and y {y.shape} must have the same shape")
        LayerNorm.check_forward(self, x, weight, bias, eps)

    def kernel_applies(self, x, y, weight, bias, p, generator, eps):
        return kernels.use_kernels(x, y, weight, bias) and len({x.dtype, y.dtype, weight.dtype, bias.dtype}) == 1

    def forward_reference(self, x, y, weight, bias, p, generator, eps):
        self.p = p
        if p:
            self.scale = _scale(y, p)
            y, self.keep = _dropped(y, p, generator)
        self.norm = LayerNorm()
        self.norm.needs_input_grad = (any(self.needs_input_grad[:2]),) + tuple(self.needs_input_grad[2:4]) + (False,)
        return self.norm.forward_reference(x + y, weight, bias, eps)

    def backward_reference(self, g):
        grad_h, grad_w, grad_b, _ = self.norm.backward_reference(g)
        grad_y = None
        if self.needs_input_grad[1] and grad_h is not None:
            grad_y = _scaled_by_mask(grad_h, self.keep, self.scale) if self.p else grad_h
        return (grad_h if self.needs_input_grad[0] else None), grad_y, grad_w, grad_b, None, None, None

    def forward_kernel(self, x, y, weight, bias, p, generator, eps):
        self.weight = weight
        self.scale = float(_scale(y, p)) if p else 1.0
        out, self.h, self.keep, self.mean, self.rstd = residual_layer_norm_kernel.residual_layer_norm_forward(
            x, y, weight, bias, p, kernel_seed(generator) if p else 0, scale=self.scale, eps=eps)
        return out

    def backward_kernel(self, g):
        grad_x, grad_y, grad_w, grad_b = residual_layer_norm_kernel.residual_layer_norm_backward(
            self.h, self.weight, g.astype(self.h.dtype, copy=False), self.mean, self.rstd, self.keep, self.scale,
            need_params=any(self.needs_input_grad[2:4]))
        return grad_x, grad_y, grad_w, grad_b, None, None, None


def residual_dropout_layer_norm(x, y, weight, bias, p=0.0, training=True, generator=None, eps=1e-5):
    """layer_norm(x + dropout(y, p, training, generator), weight, bias, eps) as one op: the
    post-LN residual connection of §5.4, x the sublayer's input and y its output; in float32
    under ``amp.autocast`` (layer norm's statistics, and the residual stream, stay float32)."""
    p = check_probability("residual_dropout_layer_norm: p", p)
    _check_generator(generator, "residual_dropout_layer_norm: generator")
    if x.ndim == 0:
        raise ValueError("residual_dropout_layer_norm: x needs a feature axis, got a 0-d tensor")
    x, y = amp.float32_args(x, y)
    return ResidualDropoutLayerNorm.apply(x, y, weight, bias, p if training else 0.0, generator,
                                          eps=check_real("residual_dropout_layer_norm: eps", eps, 0))
