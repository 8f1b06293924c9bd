"""Which kernels exist, in which source file, instantiated for which template arguments,
and launched with which block sizes.

A kernel is a ``template <typename T[, int HEAD_DIM[, int ROWS_PER_WARP]]> __global__``
function. Its *name expression* (``"softmax_forward<float>"``, ``"attention_forward<__half, 64, 4>"``)
is what CuPy's ``RawModule(name_expressions=...)`` and NVRTC instantiate; the CPU emulation
instantiates the float ones.

This module is the one home of the launch geometry. The sources get it at compile time, as
the ``ROWS_PER_WARP`` template argument and as the preprocessor definitions of
``compile_options()`` (the same for NVRTC and the g++ emulation); ``ops.py`` computes its grids
from the same names, read at launch time. No kernel source restates a block size
(tests/test_kernels_registry.py checks).
"""

import itertools
import math
from pathlib import Path

import numpy

KERNEL_DIR = Path(__file__).resolve().parent

#: numpy dtype name -> CUDA element type. bfloat16 has no NumPy/CuPy dtype: its arrays are
#: passed as uint16 storage with ``dtype="bfloat16"`` named explicitly.
CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

# ------------------------------------------------------------------ launch geometry
WARP_SIZE = 32
"""Lanes per warp: the hardware's. The shuffles' full masks assume 32 (common.cuh checks)."""
ROW_BLOCK = 256
"""Most threads per block of the one-block-per-row kernels (softmax, layer norm, cross entropy)
and of dropout; a short row gets fewer (``row_threads``). Sizes their reduction scratch."""
COLUMN_BLOCK = 128
"""Threads per block of layer norm's dw/db kernels: one column each."""
LAYER_NORM_ROWS_PER_CHUNK = 64
"""Rows one block of layer norm's first dw/db stage sums (the second sums the chunks)."""
ADAM_BLOCK = 256
"""Threads per block of the fused Adam update."""
ADAM_CHUNK = 65536
"""Elements per block of the fused Adam update."""
DROPOUT_MAX_BLOCKS = 8192
"""Most blocks of a dropout launch; the kernel strides over the rest."""
ATTENTION_WARPS = 4
"""Warps per block of every attention kernel (block = ATTENTION_WARPS · WARP_SIZE threads)."""
ATTENTION_KEY_TILE = WARP_SIZE
"""Keys (or queries) per shared-memory tile of the attention kernels: one per lane."""
ATTENTION_ROWS_PER_WARP = {32: 4, 64: 4, 128: 2}
"""Head dimension -> query (or key) rows one warp owns; two at 128 keep a block's static shared
memory within 48 KB. Its keys are the head dimensions that have kernels."""
HEAD_DIMS = tuple(ATTENTION_ROWS_PER_WARP)


def compile_options():
    """The geometry as ``-D`` definitions for the kernel sources (NVRTC and g++ take the same)."""
    definitions = {"TF_WARP_SIZE": WARP_SIZE, "TF_ROW_BLOCK": ROW_BLOCK, "TF_ATTENTION_WARPS": ATTENTION_WARPS,
                   "TF_ATTENTION_KEY_TILE": ATTENTION_KEY_TILE}
    _check_geometry()
    return [f"-D{name}={value}" for name, value in definitions.items()]


def geometry():
    """Every geometry value the sources are compiled with, as a hashable key (a compiled module's)."""
    return tuple(compile_options()) + tuple(ATTENTION_ROWS_PER_WARP.items())


def _check_geometry():
    """The few relations the kernels rely on, so that a changed value fails here and not on a GPU."""
    if ROW_BLOCK % WARP_SIZE or not WARP_SIZE <= ROW_BLOCK <= 1024:
        raise ValueError(f"registry.ROW_BLOCK must be a multiple of {WARP_SIZE} in [{WARP_SIZE}, 1024], "
                         f"got {ROW_BLOCK}")
    if ATTENTION_KEY_TILE != WARP_SIZE:
        raise ValueError(f"registry.ATTENTION_KEY_TILE must equal WARP_SIZE ({WARP_SIZE}): one key per lane")
    if not 1 <= ATTENTION_WARPS * WARP_SIZE <= 1024:
        raise ValueError(f"registry.ATTENTION_WARPS: {ATTENTION_WARPS} warps do not fit a block")
    for dim, rows in ATTENTION_ROWS_PER_WARP.items():
        if dim % WARP_SIZE or rows < 1:
            raise ValueError(f"registry.ATTENTION_ROWS_PER_WARP[{dim}] = {rows}: head dimension must be a multiple "
                             f"of {WARP_SIZE} and rows >= 1")


def row_threads(cols):
    """Threads per block of a row kernel: a multiple of the warp, at most ROW_BLOCK, no more than the row needs."""
    return max(WARP_SIZE, min(ROW_BLOCK, WARP_SIZE * math.ceil(cols / WARP_SIZE)))


def attention_threads():
    return ATTENTION_WARPS * WARP_SIZE


def attention_rows_per_block(head_dim):
    """Query (or key) rows one attention block owns."""
    return ATTENTION_WARPS * ATTENTION_ROWS_PER_WARP[head_dim]


#: source file -> {kernel name: template parameters}; "T" is the element type, "HEAD_DIM" the head
#: size, "ROWS_PER_WARP" the rows a warp owns (from ATTENTION_ROWS_PER_WARP).
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
        "attention_forward": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
        "attention_backward_delta": ("T", "HEAD_DIM"),
        "attention_backward_kv": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
        "attention_backward_q": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
    },
}


def cuda_type(dtype):
    """The CUDA element type for a dtype (numpy dtype or the name "bfloat16"); clear error otherwise."""
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    if name not in CUDA_TYPES:
        raise TypeError(f"no CUDA kernel for dtype {name}: supported are {', '.join(CUDA_TYPES)}")
    return CUDA_TYPES[name]


def name_expression(kernel, dtype, head_dim=None):
    """``"kernel<type>"``, ``"kernel<type, head_dim>"`` or ``"kernel<type, head_dim, rows per warp>"``
    as the kernel's source declares it."""
    params = _params_of(kernel)
    args = [cuda_type(dtype)]
    if "HEAD_DIM" in params:
        if head_dim not in HEAD_DIMS:
            raise ValueError(f"{kernel}: head dimension {head_dim} has no kernel (supported: {HEAD_DIMS})")
        args.append(str(head_dim))
    if "ROWS_PER_WARP" in params:
        args.append(str(ATTENTION_ROWS_PER_WARP[head_dim]))
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
