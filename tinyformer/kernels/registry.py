"""Which kernels exist, in which source file, instantiated for which template arguments.

A kernel is a ``template <typename T[, int HEAD_DIM]> __global__`` function. Its *name
expression* (``"softmax_forward<float>"``, ``"attention_forward<__half, 64>"``) is what
CuPy's ``RawModule(name_expressions=...)`` and NVRTC instantiate; the CPU emulation
instantiates the float ones.
"""

import itertools
from pathlib import Path

import numpy

KERNEL_DIR = Path(__file__).resolve().parent

#: numpy dtype name -> CUDA element type. bfloat16 has no NumPy/CuPy dtype: its arrays are
#: passed as uint16 storage with ``dtype="bfloat16"`` named explicitly.
CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
HEAD_DIMS = (32, 64, 128)

#: source file -> {kernel name: template parameters}; "T" is the element type, "HEAD_DIM" the head size.
KERNELS = {
    "softmax.cu": {"softmax_forward": ("T",), "softmax_backward": ("T",)},
    "layer_norm.cu": {
        "layer_norm_forward": ("T",),
        "layer_norm_backward_input": ("T",),
        "layer_norm_backward_params": ("T",),
        "layer_norm_reduce_params": ("T",),
    },
    "cross_entropy.cu": {"cross_entropy_forward": ("T",), "cross_entropy_backward": ("T",)},
    "adam.cu": {"adam_update": ("T",)},
    "dropout.cu": {"dropout_forward": ("T",)},
    "attention.cu": {
        "attention_forward": ("T", "HEAD_DIM"),
        "attention_backward_delta": ("T", "HEAD_DIM"),
        "attention_backward_kv": ("T", "HEAD_DIM"),
        "attention_backward_q": ("T", "HEAD_DIM"),
    },
}


def cuda_type(dtype):
    """The CUDA element type for a dtype (numpy dtype or the name "bfloat16"); clear error otherwise."""
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    if name not in CUDA_TYPES:
        raise TypeError(f"no CUDA kernel for dtype {name}: supported are {', '.join(CUDA_TYPES)}")
    return CUDA_TYPES[name]


def name_expression(kernel, dtype, head_dim=None):
    """``"kernel<type>"`` or ``"kernel<type, head_dim>"`` as the kernel's source declares it."""
    params = _params_of(kernel)
    args = [cuda_type(dtype)]
    if "HEAD_DIM" in params:
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"{kernel}: head dimension {head_dim} has no kernel (supported: {HEAD_DIMS})")
        args.append(str(head_dim))
    return f"{kernel}<{', '.join(args)}>"


def source_of(kernel):
    for source, kernels in KERNELS.items():
        if kernel in kernels:
            return source
    raise KeyError(f"unknown kernel {kernel!r}")


def _params_of(kernel):
    return KERNELS[source_of(kernel)][kernel]


def instantiations(source, dtypes=tuple(CUDA_TYPES)):
    """Every name expression of ``source`` for ``dtypes`` (each head dimension where templated)."""
    out = []
    for kernel, params in KERNELS[source].items():
        dims = HEAD_DIMS if "HEAD_DIM" in params else (None,)
        for dtype, dim in itertools.product(dtypes, dims):
            out.append(name_expression(kernel, dtype, dim))
    return out


def read_source(source):
    return (KERNEL_DIR / source).read_text(encoding="utf-8")
