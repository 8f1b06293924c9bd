"""The one pattern every fused op follows to choose between its CUDA kernel and its NumPy reference."""

from ..tensor import Function


class KernelFunction(Function):
    """A fused op with two paths: ``forward_cpu``/``backward_cpu``, the NumPy reference (written on
    the arrays' own module, so it also runs on CuPy arrays when the kernel does not apply), and
    ``forward_gpu``/``backward_gpu``, the call into the op's CUDA kernel (Chainer's names).

    ``forward`` checks the inputs (``check_forward``), then picks the path once:
    ``uses_kernel = kernel_applies(...)``, which is ``kernels.use_kernels`` on the op's arrays
    plus the op's own conditions. ``backward`` follows the forward's choice.
    """

    def forward(self, *args, **params):
        self.check_forward(*args, **params)
        self.uses_kernel = bool(self.kernel_applies(*args, **params))
        return (self.forward_gpu if self.uses_kernel else self.forward_cpu)(*args, **params)

    def backward(self, *grad_outputs):
        return (self.backward_gpu if self.uses_kernel else self.backward_cpu)(*grad_outputs)

    def check_forward(self, *args, **params):
        """Raise on inputs that neither path takes (Chainer's ``check_type_forward``); none by default."""

    def kernel_applies(self, *args, **params):
        """Whether the CUDA kernel runs this call: ``use_kernels(arrays)`` and the op's own conditions.
        What it works out for the kernel on the way (attention: the key lengths) it may keep on ``self``."""
        raise NotImplementedError

    def forward_cpu(self, *args, **params):
        raise NotImplementedError

    def forward_gpu(self, *args, **params):
        raise NotImplementedError

    def backward_cpu(self, *grad_outputs):
        raise NotImplementedError

    def backward_gpu(self, *grad_outputs):
        raise NotImplementedError
