"""Which path each op takes on a device: a pure function of (compute capability, dtype, head size,
options), so that the whole table is testable without the GPUs it describes.

The device's capability comes from ``backend.compute_capability()`` (capped by
``$TINYFORMER_MAX_CAPABILITY``); the CPU emulation of the kernels stands for ``EMULATION_CAPABILITY``
(capped the same way). The families' requirements are ``registry.REQUIREMENTS``:

* attention: float16/bfloat16 on sm_80+ take the tensor cores (attention_mma.cu); float32, and
  float16 on sm_70/75 (no m16n8k16, no cp.async), the CUDA-core kernels (attention.cu), which
  load 16-bit elements and compute in float; bfloat16 below sm_80 is refused (``precision_problem``);
  head sizes without a kernel, masks other than key lengths, or returned weights take the NumPy
  reference on the arrays' device.
* every other fused op and Adam: its kernel for every element type its family runs there.
"""

import functools
import os
from collections import namedtuple

from .. import backend
from . import registry

EMULATION_CAPABILITY = "sm_80"
"""What the CPU emulation implements: the sm_80 instructions of the tensor-core attention
(mma.m16n8k16 in f16 and bf16, ldmatrix, cp.async), emulated warp by warp."""

Path = namedtuple("Path", "name source kernels reason")
"""``name``: "tensor cores", "CUDA cores", "reference" or "refused"; ``source``: the kernel file (or
None); ``kernels``: the kernels one forward and backward launch; ``reason``: why, in words."""

TENSOR_CORE_ATTENTION = ("attention_mma_forward", "attention_backward_delta", "attention_mma_backward_q",
                         "attention_mma_backward_kv")
CUDA_CORE_ATTENTION = ("attention_forward", "attention_backward_delta", "attention_backward_q",
                       "attention_backward_kv")
OPS = {  # op (as ``tinyformer info`` names it) -> its kernel source
    "softmax": "softmax.cu", "layer_norm": "layer_norm.cu", "cross_entropy": "cross_entropy.cu",
    "dropout": "dropout.cu", "linear_relu_dropout": "bias_relu_dropout.cu",
    "residual_layer_norm": "residual_layer_norm.cu", "embedding (input, backward)": "embedding.cu", "adam": "adam.cu",
}
PRECISION_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@functools.lru_cache(maxsize=64)
def capability_number(capability):
    """75 for "sm_75" or 75; None for None (no device)."""
    if capability is None or isinstance(capability, int):
        return capability
    return backend.capability_number(capability)


def device_capability():
    """The capability the dispatch reads now: the GPU's (capped), else the emulation's (capped)."""
    return backend.compute_capability() or backend.capped_capability(EMULATION_CAPABILITY)


def precision_problem(capability, dtype, device=None):
    """The one-line refusal of ``dtype`` (a numpy dtype name, or fp32/fp16/bf16) on an architecture of
    ``capability``, or None where it runs; ``device`` names the GPU in the message."""
    dtype = PRECISION_DTYPES.get(dtype, dtype)
    number = capability_number(capability)
    if number is None or dtype not in registry.DTYPE_CAPABILITY or number >= registry.DTYPE_CAPABILITY[dtype]:
        return None
    needed = registry.DTYPE_CAPABILITY[dtype]
    name = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    return (f"precision {name} needs compute capability {needed / 10:.1f} (sm_{needed}) or newer, and "
            f"{device or 'this GPU'} is {number / 10:.1f} (sm_{number}): use --precision fp16 there "
            "(CUDA-core attention, loss scaling) or fp32")


def attention_path(capability, dtype, head_dim, kernels_on=True, fits=True):
    """The attention's path for arrays of ``dtype`` (a name) and ``head_dim`` on an architecture of
    ``capability`` (None: no GPU); ``kernels_on``: ``$TINYFORMER_KERNELS`` is not 0; ``fits``: the
    call's mask is key lengths (or none) and it returns no weights."""
    number = capability_number(capability)
    if (plain := _without_kernels(number, dtype, kernels_on)) is not None:
        return plain
    problem = precision_problem(number, dtype)
    if problem is not None:
        return Path("refused", None, (), problem)
    if head_dim not in registry.HEAD_DIMS:
        return Path("reference", None, (), f"head size {head_dim} has no kernel (they take {registry.HEAD_DIMS})")
    if not fits:
        return Path("reference", None, (), "a mask other than key lengths, or weights returned")
    if registry.runs_on("attention_mma.cu", dtype, number):
        return Path("tensor cores", "attention_mma.cu", TENSOR_CORE_ATTENTION,
                    f"{dtype} on sm_{number}: mma.m16n8k16 (FlashAttention-2)")
    why = ("float32 keeps the exact CUDA-core kernel" if dtype == "float32" else
           f"{dtype} on sm_{number}: {registry.REQUIREMENTS['attention_mma.cu'].why.split(':')[0]} need sm_80")
    return Path("CUDA cores", "attention.cu", CUDA_CORE_ATTENTION, why)


def _without_kernels(number, dtype, kernels_on):
    """The reference path where no kernel runs whatever the op (no GPU, switched off, too old a
    GPU, a dtype without kernels), else None."""
    if number is None:
        return Path("reference", None, (), "no GPU: NumPy on the CPU")
    if not kernels_on:
        return Path("reference", None, (), "TINYFORMER_KERNELS=0")
    if number < registry.OLDEST_CAPABILITY:
        return Path("reference", None, (), f"sm_{number} is older than the kernels' oldest, "
                                           f"sm_{registry.OLDEST_CAPABILITY}: CuPy's own ops")
    if dtype not in registry.CUDA_TYPES:
        return Path("reference", None, (), f"no kernel for {dtype}")
    return None


def op_path(op, capability, dtype, kernels_on=True):
    """The path of one of ``OPS`` (every fused op but attention, and Adam) for ``dtype`` on ``capability``."""
    number, source = capability_number(capability), OPS[op]
    if (plain := _without_kernels(number, dtype, kernels_on)) is not None:
        return plain
    if not registry.runs_on(source, dtype, number):
        return Path("refused", None, (), precision_problem(number, dtype) or f"{source} needs more than sm_{number}")
    return Path("CUDA cores", source, tuple(registry.KERNELS[source]), f"{source} in {dtype}")


def reachable_instantiations(capability):
    """Every name expression the dispatch launches on an architecture of ``capability``, for any
    dtype and head size: what compile_check must compile for it (``registry.instantiations_for``
    compiles these and may hold more: attention.cu's float16 kernels on sm_80+, for direct calls)."""
    out = []
    for dtype in registry.CUDA_TYPES:
        for op, source in OPS.items():
            if op_path(op, capability, dtype).name != "refused":
                out += [e for e in registry.instantiations(source, (dtype,)) if e not in out]
        for dim in registry.HEAD_DIMS:
            for kernel in attention_path(capability, dtype, dim).kernels:
                expression = registry.name_expression(kernel, dtype, dim)
                out += [] if expression in out else [expression]
    return out


def training_line(device, precision, head_dim, capability=None, name=None):
    """The run's first word on its arithmetic: device, precision and the attention's path (and why)."""
    dtype = PRECISION_DTYPES[precision]
    if device != "cuda":
        return (f"device cpu, precision {precision}: NumPy ops on the CPU"
                + (" (half products in float32, rounded to the half type)" if dtype != "float32" else ""))
    capability = capability or device_capability()
    path = attention_path(capability, dtype, head_dim, kernels_on=kernels_switched_on())
    scaled = ", dynamic loss scaling" if precision == "fp16" else ""
    where = f"{name or backend.device_name() or 'GPU'} ({capability})"
    source = f" ({path.source})" if path.source else ""
    return f"device cuda {where}, precision {precision}{scaled}: attention on {path.name}{source}, {path.reason}"


def kernels_switched_on():
    """``$TINYFORMER_KERNELS`` is not "0" (``kernels.use_kernels``'s switch)."""
    return os.environ.get("TINYFORMER_KERNELS", "1") != "0"
