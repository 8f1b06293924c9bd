"""The one harness that checks each CUDA kernel against its NumPy reference.

A case draws float32 inputs, rounds them to the element type under test, runs the kernel's
launcher (``tinyformer.engine.kernels.softmax`` for softmax.cu, ...) on the device (CuPy arrays:
the compiled kernel; NumPy arrays: its very source through the C++ emulation, ``testing.emulation``)
and returns a ``KernelRun``: one ``Comparison`` per kernel result against the reference of ``functional`` (or
``optim.Adam``), computed in float64 from the same rounded values for a random upstream
gradient. ``tinyformer gradcheck`` shows its verdicts as the ``kernel_*`` rows
(gradcheck_suite.KERNEL_CASES); tests/engine/kernels/test_emulation.py (the CPU's emulation and a GPU)
calls the same cases over more shapes and element types.

One module per kernel's case (``softmax.py`` checks softmax.cu, ``attention.py`` attention.cu
and attention_mma.cu, ...), and ``harness.py``, what they share: the element types' tolerances,
``Device``, ``Comparison`` and ``KernelRun``. The tensor-core instructions themselves are checked
by the tests (tests/mma_probes.py, against the PTX ISA's layouts in tests/ptx_layouts.py).
The package binds the case functions after importing their modules, as ``functional`` does, so
``kernel_cases.softmax`` is the case.

It sits in ``tinyformer.testing``, above both ``kernels/`` and the references it checks
(functional, optim), so that ``kernels/`` imports nothing of the ops that call it.
"""

from .harness import GRAD_FACTOR, TOLERANCE, Comparison, Device, KernelRun, compared, rand, reference
from .adam import ADAM, ADAM_POISONS, adam, adam_skip
from .attention import MMA_LAYOUTS, attention, attention_mma
from .bias_relu_dropout import bias_relu_dropout
from .cross_entropy import cross_entropy
from .dropout import dropout
from .embedding import embedding
from .layer_norm import layer_norm
from .residual_layer_norm import residual_layer_norm
from .softmax import softmax

__all__ = [
    "TOLERANCE", "GRAD_FACTOR", "Comparison", "KernelRun", "Device", "compared", "rand", "reference",
    "softmax", "layer_norm", "cross_entropy", "ADAM", "ADAM_POISONS", "adam", "adam_skip", "dropout",
    "bias_relu_dropout", "residual_layer_norm", "embedding", "MMA_LAYOUTS", "attention", "attention_mma",
]
