"""Which kernels exist, in which source file, instantiated for which template arguments,
and launched with which block sizes.

A kernel is a ``template <typename T[, int HEAD_DIM[, int ROWS_PER_WARP | int TILE]]> __global__``
function. Its *name expression* (``"softmax_forward<float>"``, ``"attention_forward<__half, 64, 4>"``,
``"attention_mma_forward<__nv_bfloat16, 64, 64>"``) is what CuPy's ``RawModule(name_expressions=...)``
and NVRTC instantiate; the CPU emulation instantiates ``emulated_instantiations()``: every kernel
in every element type but the CUDA-core attention in bfloat16, which no architecture's path takes.
What each kernel family needs of the device (``REQUIREMENTS``, ``DTYPE_CAPABILITY``) is here too,
beside ``KERNELS``: ``instantiations_for(source, arch)`` is what an architecture compiles.

This module is the one home of the launch geometry. The sources get it at compile time, as
the ``ROWS_PER_WARP`` template argument and as the preprocessor definitions of
``compile_options()`` (the same for NVRTC and the g++ emulation) and the ``TILE`` template argument;
each kernel's launcher (``softmax.py`` beside ``softmax.cu``, ...) computes its grids and dynamic
shared memory from the same names, read at launch time. No kernel source restates a block size
(tests/engine/kernels/test_registry.py checks).

It is also the one home of the element types (``CUDA_TYPES``, narrowed per source by
``SOURCE_DTYPES``) and of the table of kernels and their template parameters (``KERNELS``):
NVRTC, the CPU emulation, the compile check and the launchers all read the same table; a table split
among the launchers would leave the tools that need every kernel to gather it back. What is one
kernel's alone (Adam's scalar buffer, the attention kernels' shape rules) sits with its launcher.
"""

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy

KERNEL_DIR = Path(__file__).resolve().parent

#: numpy dtype name -> CUDA element type; bfloat16 is ml_dtypes' NumPy dtype (``backend.bfloat16``),
#: which CuPy 14 arrays take too: the ``__nv_bfloat16`` instantiations read those arrays directly.
CUDA_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}

# ------------------------------------------------------------------ launch geometry
WARP_SIZE = 32
"""Lanes per warp: the hardware's. The shuffles' full masks assume 32 (common.cuh checks)."""
ROW_BLOCK = 256
"""Most threads per block of the one-block-per-row kernels (softmax, layer norm, cross entropy)
and of dropout; a short row gets fewer (``row_threads``). Sizes their reduction scratch."""
COLUMN_BLOCK = 128
"""Threads per block of layer norm's dw/db reduction (layer_norm_reduce_params): one column each."""
LAYER_NORM_ROWS_PER_CHUNK = 16
"""Rows one block of layer norm's backward walks (layer_norm_backward_input, residual_layer_norm_backward):
dx row by row, and the chunk's sums of dw and db; one launch then sums the chunks. Fewer rows per
block, more blocks (4,096 rows: 256) but more partials to sum."""
ADAM_BLOCK = 256
"""Threads per block of the fused Adam update and its gradient-norm pass (whole warps, at most 1024)."""
ADAM_CHUNK = 65536
"""Elements per block of the fused Adam update and its gradient-norm pass."""
EMBEDDING_COLUMNS_PER_THREAD = 4
"""Columns one thread of the embedding's weight gradient sums per pass over the ids (its block has
``row_threads(positions)`` threads; wider rows take more passes)."""
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
MMA_ATTENTION_WARPS = 4
"""Warps per block of the tensor-core attention kernels (attention_mma.cu); each owns 16 rows,
the mma's M, so a block owns 16 · MMA_ATTENTION_WARPS query (or key) rows."""
MMA_ATTENTION_TILE = {32: 64, 64: 64, 128: 32}
"""Head dimension -> rows of the streamed side per shared-memory tile of the tensor-core kernels
(keys in the forward and dQ kernels, queries in the dK/dV kernel); a multiple of 16. Smaller at
128 so that the dK/dV kernel's accumulators stay in registers (no spills, compile_check checks)."""
MMA_ROWS_PER_WARP = 16
"""Rows a warp of the tensor-core kernels owns: the M of mma.m16n8k16, fixed by the instruction."""
MMA_PAD = 8
"""16-bit elements of padding per shared-memory row of the tensor-core kernels: rows of D + 8
elements put the 8 rows an ldmatrix reads 16 bytes apart in the bank cycle. A multiple of 8 (the
rows stay 16-byte aligned for cp.async)."""
MMA_DTYPES = ("float16", "bfloat16")
"""Element types of the tensor-core kernels (float32 keeps the exact CUDA-core kernel)."""


def compile_options():
    """The geometry as ``-D`` definitions for the kernel sources (NVRTC and g++ take the same)."""
    definitions = {"TF_WARP_SIZE": WARP_SIZE, "TF_ROW_BLOCK": ROW_BLOCK, "TF_ATTENTION_WARPS": ATTENTION_WARPS,
                   "TF_ATTENTION_KEY_TILE": ATTENTION_KEY_TILE, "TF_MMA_ATTENTION_WARPS": MMA_ATTENTION_WARPS,
                   "TF_MMA_ROWS_PER_WARP": MMA_ROWS_PER_WARP, "TF_MMA_PAD": MMA_PAD,
                   "TF_EMBEDDING_COLUMNS": EMBEDDING_COLUMNS_PER_THREAD}
    _check_geometry()
    return [f"-D{name}={value}" for name, value in definitions.items()]


def geometry():
    """Every geometry value the sources are compiled with, as a hashable key (a compiled module's)."""
    # the values themselves (checked where they are compiled: compile_options), not re-checked per launch
    return (WARP_SIZE, ROW_BLOCK, ATTENTION_WARPS, ATTENTION_KEY_TILE, MMA_ATTENTION_WARPS, MMA_ROWS_PER_WARP,
            MMA_PAD, EMBEDDING_COLUMNS_PER_THREAD, *ATTENTION_ROWS_PER_WARP.items(), *MMA_ATTENTION_TILE.items())


def _check_geometry():
    """The few relations the kernels rely on, so that a changed value fails here and not on a GPU."""
    if ROW_BLOCK % WARP_SIZE or not WARP_SIZE <= ROW_BLOCK <= 1024:
        raise ValueError(f"registry.ROW_BLOCK must be a multiple of {WARP_SIZE} in [{WARP_SIZE}, 1024], "
                         f"got {ROW_BLOCK}")
    if ADAM_BLOCK % WARP_SIZE or not WARP_SIZE <= ADAM_BLOCK <= 1024:
        raise ValueError(f"registry.ADAM_BLOCK must be a multiple of {WARP_SIZE} in [{WARP_SIZE}, 1024], "
                         f"got {ADAM_BLOCK}")
    if ATTENTION_KEY_TILE != WARP_SIZE:
        raise ValueError(f"registry.ATTENTION_KEY_TILE must equal WARP_SIZE ({WARP_SIZE}): one key per lane")
    if not 1 <= ATTENTION_WARPS * WARP_SIZE <= 1024:
        raise ValueError(f"registry.ATTENTION_WARPS: {ATTENTION_WARPS} warps do not fit a block")
    if not 1 <= MMA_ATTENTION_WARPS * WARP_SIZE <= 1024:
        raise ValueError(f"registry.MMA_ATTENTION_WARPS: {MMA_ATTENTION_WARPS} warps do not fit a block")
    if set(MMA_ATTENTION_TILE) != set(ATTENTION_ROWS_PER_WARP):
        raise ValueError("registry.MMA_ATTENTION_TILE must name the same head dimensions as ATTENTION_ROWS_PER_WARP")
    if MMA_ROWS_PER_WARP != 16:
        raise ValueError("registry.MMA_ROWS_PER_WARP is the M of mma.m16n8k16: 16")
    if MMA_PAD % 8 or MMA_PAD < 0:
        raise ValueError(f"registry.MMA_PAD must be a multiple of 8 elements (16 bytes), got {MMA_PAD}")
    for dim, tile in MMA_ATTENTION_TILE.items():
        if dim % 16 or tile % 16 or not 16 <= tile <= MMA_ATTENTION_WARPS * WARP_SIZE:
            raise ValueError(f"registry.MMA_ATTENTION_TILE[{dim}] = {tile}: head dimension and tile must be "
                             f"multiples of 16, the tile at most {MMA_ATTENTION_WARPS * WARP_SIZE}")
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


def mma_attention_threads():
    return MMA_ATTENTION_WARPS * WARP_SIZE


def mma_attention_rows_per_block():
    """Query (or key) rows one tensor-core attention block owns."""
    return MMA_ATTENTION_WARPS * MMA_ROWS_PER_WARP


def mma_attention_shared_bytes(kernel, head_dim):
    """Dynamic shared memory of a tensor-core attention kernel (the layout attention_mma.cu states)."""
    rows, tile = mma_attention_rows_per_block(), MMA_ATTENTION_TILE[head_dim]
    row_bytes = (head_dim + MMA_PAD) * 2
    if kernel == "attention_mma_forward":
        return (rows + 4 * tile) * row_bytes
    if kernel == "attention_mma_backward_q":
        return (2 * rows + 4 * tile) * row_bytes
    if kernel == "attention_mma_backward_kv":
        return (2 * rows + 4 * tile) * row_bytes + 4 * tile * 4
    raise KeyError(f"{kernel} is not a tensor-core attention kernel")


#: source file -> {kernel name: template parameters}; "T" is the element type, "HEAD_DIM" the head
#: size, "ROWS_PER_WARP" the rows a warp owns (from ATTENTION_ROWS_PER_WARP), "TILE" the streamed
#: tile of the tensor-core kernels (from MMA_ATTENTION_TILE).
KERNELS = {
    "softmax.cu": {"softmax_forward": ("T",), "softmax_backward": ("T",)},
    "layer_norm.cu": {
        "layer_norm_forward": ("T",),
        "layer_norm_backward_input": ("T",),
        "layer_norm_reduce_params": ("T",),
    },
    "cross_entropy.cu": {"cross_entropy_forward": ("T",), "cross_entropy_backward": ("T",)},
    "adam.cu": {"adam_norm_partials": ("T",), "adam_update": ("T",)},
    "dropout.cu": {"dropout_forward": ("T",)},
    "bias_relu_dropout.cu": {"bias_relu_dropout_forward": ("T",), "bias_relu_dropout_backward": ("T",)},
    # the *_mixed kernels: x, h, out and the parameters float32, y and dy of T (autocast's half sublayer output)
    "residual_layer_norm.cu": {"residual_layer_norm_forward": ("T",), "residual_layer_norm_backward": ("T",),
                               "residual_layer_norm_forward_mixed": ("T",), "residual_layer_norm_backward_mixed": ("T",)},
    "embedding.cu": {"embedding_forward": ("T",), "embedding_backward": ("T",)},
    "attention.cu": {
        "attention_forward": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
        "attention_backward_delta": ("T", "HEAD_DIM"),
        "attention_backward_kv": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
        "attention_backward_q": ("T", "HEAD_DIM", "ROWS_PER_WARP"),
    },
    "attention_mma.cu": {
        "attention_mma_forward": ("T", "HEAD_DIM", "TILE"),
        "attention_mma_backward_q": ("T", "HEAD_DIM", "TILE"),
        "attention_mma_backward_kv": ("T", "HEAD_DIM", "TILE"),
    },
}
# ------------------------------------------------------------------ what each family needs of the device
OLDEST_CAPABILITY = 70
"""The oldest architecture any kernel is built for: Volta (sm_70), the first with independent thread
scheduling, which the ``*_sync`` warp shuffles assume. CUDA 13 no longer compiles for it (CUDA 12 does)."""
DTYPE_CAPABILITY = {"float32": 70, "float16": 70, "bfloat16": 80}
"""Element type -> the oldest architecture that runs it: bfloat16 has no tensor-core instruction
(mma ``.bf16``) and no native arithmetic below Ampere (sm_80), where cuda_bf16.h would emulate it
in float at float32's cost; the engine refuses it there (``kernels.paths.precision_problem``)."""


@dataclass(frozen=True)
class Requirement:
    """What a kernel family (one source file) needs: the oldest architecture, the element types, and why."""
    capability: int
    dtypes: tuple
    why: str


#: source file -> its family's requirement (next to KERNELS' entry of the same source).
REQUIREMENTS = {source: Requirement(OLDEST_CAPABILITY, tuple(CUDA_TYPES), "warp shuffles (*_sync), atomics")
                for source in KERNELS}
REQUIREMENTS["attention_mma.cu"] = Requirement(
    80, MMA_DTYPES, "mma.sync.m16n8k16 in .f16/.bf16, cp.async and ldmatrix: sm_80 (Ampere) and newer")
#: source file -> its element types, where not every one of CUDA_TYPES.
SOURCE_DTYPES = {s: r.dtypes for s, r in REQUIREMENTS.items() if r.dtypes != tuple(CUDA_TYPES)}


def runs_on(source, dtype, capability):
    """Whether ``source``'s family runs ``dtype`` (a name) on an architecture of ``capability`` (75 or
    "sm_75"): its requirement and the element type's (``DTYPE_CAPABILITY``)."""
    number = capability if isinstance(capability, int) else str(capability).removeprefix("sm_")
    if not str(number).isdigit():
        raise ValueError(f"architecture must look like sm_75, got {capability!r}")
    requirement = REQUIREMENTS[source]
    return dtype in requirement.dtypes and int(number) >= max(requirement.capability, DTYPE_CAPABILITY[dtype])


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
    if "TILE" in params:
        args.append(str(MMA_ATTENTION_TILE[head_dim]))
    name = dtype if isinstance(dtype, str) else numpy.dtype(dtype).name
    allowed = SOURCE_DTYPES.get(source_of(kernel), tuple(CUDA_TYPES))
    if name not in allowed:
        raise TypeError(f"{kernel}: no instantiation for dtype {name} (it has {', '.join(allowed)})")
    return f"{kernel}<{', '.join(args)}>"


def source_of(kernel):
    for source, kernels in KERNELS.items():
        if kernel in kernels:
            return source
    raise KeyError(f"unknown kernel {kernel!r}")


def _params_of(kernel):
    return KERNELS[source_of(kernel)][kernel]


def instantiations(source, dtypes=tuple(CUDA_TYPES)):
    """Every name expression of ``source`` for those of ``dtypes`` it has (each head dimension where templated)."""
    out = []
    dtypes = [d for d in dtypes if d in SOURCE_DTYPES.get(source, CUDA_TYPES)]
    for kernel, params in KERNELS[source].items():
        dims = HEAD_DIMS if "HEAD_DIM" in params else (None,)
        for dtype, dim in itertools.product(dtypes, dims):
            out.append(name_expression(kernel, dtype, dim))
    return out


def instantiations_for(source, capability):
    """The name expressions of ``source`` an architecture of ``capability`` runs (``runs_on``): what
    compile_check and prebuilt compile for it, and a GPU of it loads; empty where the family needs more."""
    return instantiations(source, dtypes=[d for d in CUDA_TYPES if runs_on(source, d, capability)])


def emulated_instantiations():
    """What the CPU emulation builds: every kernel in every element type, except the CUDA-core
    attention (attention.cu) in bfloat16, which no architecture's dispatch takes (the float16 ones
    are sm_70/75's path; of the bfloat16 ones, the delta kernel the tensor-core backward uses is built)."""
    out = [e for source in KERNELS for e in instantiations(source, dtypes=("float32",))]
    out += [e for source in KERNELS if source != "attention.cu" for e in instantiations(source) if e not in out]
    out += [e for e in instantiations("attention.cu", dtypes=("float16",)) if e not in out]
    out += [name_expression("attention_backward_delta", "bfloat16", dim) for dim in HEAD_DIMS]
    return out


def read_source(source):
    return (KERNEL_DIR / source).read_text(encoding="utf-8")


def kernel_files():
    """Every file of kernels/ a build reads: the .cu sources and the .cuh headers; what a built
    product's key hashes (a CPU build adds its own headers)."""
    return sorted(p for p in KERNEL_DIR.iterdir() if p.suffix in (".cu", ".cuh"))
