"""Fused neural-network ops, each one Function with a backward derived by hand.

Composing softmax or layer norm from elementary ops works (the engine differentiates
anything), but it stores every intermediate and walks a dozen graph nodes. Here each op is a
single node whose backward is the closed-form derivative, written beside its forward, one op
family per module, each beside its CUDA twin in ``kernels/``:

    softmax.py        Softmax, LogSoftmax              kernels/softmax.cu
    layer_norm.py     LayerNorm                        kernels/layer_norm.cu
    cross_entropy.py  CrossEntropy (and nll_loss)      kernels/cross_entropy.cu
    dropout.py        Dropout                          kernels/dropout.cu
    residual.py       ResidualDropoutLayerNorm         kernels/residual_layer_norm.cu
    attention.py      ScaledDotProductAttention        kernels/attention_mma.cu, attention.cu
    linear.py         Linear, LinearRelu, LinearReluDropout  kernels/bias_relu_dropout.cu
    projections.py    LinearParts (Q, K and V as one product)  cuBLAS
    embedding.py      Embedding, EmbeddingInput          kernels/embedding.cu
    masks.py          causal_mask, padding_mask, KeyLengthMask, sinusoid_table

**Kernel dispatch: one rule, one pattern.** The rule is ``kernels.use_kernels(*arrays)``:
CuPy arrays of float32/float16/bfloat16, unless ``TINYFORMER_KERNELS=0`` (float64, as in gradient
checks, always takes the reference); Adam's fused step asks the same question. Every op with a
kernel subclasses ``KernelFunction`` (``_dispatch.py``) and writes ``forward_reference`` /
``backward_reference`` (the NumPy reference, which is the kernel's specification and also runs
on CuPy arrays when the kernel does not apply) and ``forward_kernel`` / ``backward_kernel`` (the
call into the kernel's launcher, the module beside its .cu). ``forward`` picks the path once, from
``kernel_applies``: the rule on the op's arrays plus the op's own condition (softmax: the last
axis; attention: no mask or a padding mask, a head dim the kernel has, no returned weights);
the backward follows the forward's choice, recorded as ``uses_kernel``.

The module names are those of the ops, so ``F.softmax`` is the function; the package binds the
functions after importing its modules (``importlib.import_module("tinyformer.engine.functional.softmax")``
reaches a module itself).

Imported as ``from tinyformer import functional as F``.
"""

from ._dispatch import KernelFunction
from .attention import ScaledDotProductAttention, scaled_dot_product_attention
from .cross_entropy import CrossEntropy, cross_entropy, nll_loss
from .dropout import Dropout, dropout
from .embedding import Embedding, EmbeddingInput, embedding, embedding_input
from .layer_norm import LayerNorm, layer_norm
from .linear import Linear, LinearRelu, LinearReluDropout, linear, linear_relu, linear_relu_dropout
from .projections import LinearParts, linear_parts
from .masks import KeyLengthMask, causal_mask, padding_mask, sinusoid_table
from .residual import ResidualDropoutLayerNorm, residual_dropout_layer_norm
from .softmax import LogSoftmax, Softmax, log_softmax, softmax

__all__ = [
    "softmax",
    "log_softmax",
    "layer_norm",
    "dropout",
    "residual_dropout_layer_norm",
    "embedding",
    "embedding_input",
    "linear",
    "linear_relu",
    "linear_relu_dropout",
    "linear_parts",
    "cross_entropy",
    "nll_loss",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "KeyLengthMask",
    "sinusoid_table",
    "Softmax",
    "LogSoftmax",
    "LayerNorm",
    "Dropout",
    "ResidualDropoutLayerNorm",
    "LinearReluDropout",
    "Embedding",
    "EmbeddingInput",
    "Linear",
    "LinearRelu",
    "LinearParts",
    "CrossEntropy",
    "ScaledDotProductAttention",
    "KernelFunction",
]
