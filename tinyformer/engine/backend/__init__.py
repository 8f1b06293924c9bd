"""Array backends: NumPy on the CPU, CuPy on the GPU.

Everything above the backend asks it for the array module of the arrays at hand
(``get_array_module``), the way Chainer and CuPy code does, so the same op code runs on either
device. One module per concern, their names all here (``backend.to_numpy``, ``backend.cast``,
...):

* ``devices``: NumPy or CuPy, the device of an array, moving arrays between devices, the array
  helpers that differ between them (the only module here that imports ``cupy``);
* ``threads``: large row-wise NumPy work split over threads;
* ``allocator``: freed memory kept by the C library's allocator for the next training step;
* ``half_precision``: float16 and bfloat16, and the casts to and from bfloat16;
* ``out_of_memory``: what an allocation that does not fit on the GPU raises and reports;
* ``capture``: the region of a CUDA graph capture (no read-back inside; the memory the NumPy
  reference's outputs become there, the seam of a capture whose memory is not CuPy's);
* ``cuda_graphs``: ``GraphCapture``, capturing and replaying CUDA graphs on CuPy;
* ``back_to_back``: arrays packed back to back in one buffer, and recognised as one array.

``bfloat16`` and ``HALF_DTYPES`` are made on first use (importing ml_dtypes takes over a second).
A setting lives in its module, which reads it there: change it there
(``backend.threads.ROW_BLOCK_MIN_ELEMENTS``), not through the name re-exported here.
"""

from .allocator import keep_freed_memory
from .back_to_back import address, back_to_back, pack_back_to_back, root_buffer, side_by_side
from .capture import (CaptureUnavailable, Launch, LaunchCounts, captured_memory, capturing, check_not_capturing,
                      counting_launches, is_capturing, is_counting_launches, note_launch)
from .cuda_graphs import GraphCapture, graph_nodes
from .devices import (DEFAULT_DTYPE, DEVICES, MAX_CAPABILITY, capability_number, capped_capability, check_device,
                      compute_capability, copy_into, cuda_runtime_major, device_facts, device_name, device_of, erf,
                      get_array_module, is_cupy_array, is_gpu_available, like, load_module, raw_module, scatter_add,
                      scatter_add_rows, to_device, to_numpy)
from .half_precision import (BFLOAT16_CAST_PROBE, cast, from_bfloat16, has_half_matmul, has_native_bfloat16_cast,
                             is_bfloat16, is_floating, is_half, to_bfloat16)
from .out_of_memory import out_of_memory_errors, out_of_memory_report
from .threads import ROW_BLOCK_MIN_ELEMENTS, blockwise, get_num_threads, map_row_blocks, set_num_threads

__all__ = [
    # devices
    "DEFAULT_DTYPE", "DEVICES", "is_gpu_available", "is_cupy_array", "get_array_module", "device_of", "check_device",
    "to_device", "to_numpy", "like", "copy_into", "scatter_add", "scatter_add_rows", "erf", "cuda_runtime_major",
    "raw_module", "load_module", "compute_capability", "MAX_CAPABILITY", "capability_number", "capped_capability",
    "device_name", "device_facts",
    # threads
    "ROW_BLOCK_MIN_ELEMENTS", "get_num_threads", "set_num_threads", "map_row_blocks", "blockwise",
    # allocator
    "keep_freed_memory",
    # half_precision (bfloat16 and HALF_DTYPES: on first use)
    "bfloat16", "HALF_DTYPES", "is_bfloat16", "is_floating", "is_half", "to_bfloat16", "from_bfloat16", "cast",
    "BFLOAT16_CAST_PROBE", "has_native_bfloat16_cast", "has_half_matmul",
    # out_of_memory
    "out_of_memory_errors", "out_of_memory_report",
    # capture, cuda_graphs
    "capturing", "is_capturing", "captured_memory", "check_not_capturing", "CaptureUnavailable", "GraphCapture",
    "counting_launches", "is_counting_launches", "note_launch", "Launch", "LaunchCounts", "graph_nodes",
    # back_to_back
    "pack_back_to_back", "back_to_back", "side_by_side", "address", "root_buffer",
]


def __getattr__(name):
    """``backend.bfloat16`` and ``backend.HALF_DTYPES``, made on first use (PEP 562), by
    ``half_precision``."""
    if name not in ("bfloat16", "HALF_DTYPES"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import half_precision

    globals()[name] = getattr(half_precision, name)
    return globals()[name]
