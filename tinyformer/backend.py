"""Array backends: NumPy on the CPU, CuPy on the GPU.

This is the only module that imports ``cupy``. Everything else asks it for the
array module of the arrays at hand (``get_array_module``), the way Chainer and
CuPy code does, so the same op code runs on either device.
"""

import numpy

try:  # CuPy is optional: the ``gpu`` extra.
    import cupy as _cupy
except Exception:  # ImportError, or a broken CUDA install raising at import time.
    _cupy = None

DEFAULT_DTYPE = numpy.float32
"""Floating dtype given to data created from Python floats (as in PyTorch)."""

DEVICES = ("cpu", "cuda")

_gpu_available = None


def is_gpu_available():
    """True when CuPy is installed *and* reports a usable CUDA device.

    Based on ``cupy.is_available()``: a successful import alone says nothing
    about a driver or a device being present.
    """
    global _gpu_available
    if _gpu_available is None:
        try:
            _gpu_available = _cupy is not None and bool(_cupy.is_available())
        except Exception:
            _gpu_available = False
    return _gpu_available


def is_cupy_array(array):
    return _cupy is not None and isinstance(array, _cupy.ndarray)


def get_array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if _cupy is not None:
        for a in arrays:
            if isinstance(a, _cupy.ndarray):
                return _cupy
    return numpy


def device_of(array):
    """``"cuda"`` for a CuPy array, ``"cpu"`` for anything else."""
    return "cuda" if is_cupy_array(array) else "cpu"


def check_device(device):
    """Validate a device name; ``"cuda:0"`` style suffixes are not supported."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not is_gpu_available():
        raise RuntimeError(
            "device 'cuda' requested but no GPU is usable: install the 'gpu' extra "
            "(cupy-cuda12x or cupy-cuda13x) on a machine with a CUDA driver"
        )
    return device


def to_device(array, device):
    """Return ``array`` on ``device`` (``"cpu"`` or ``"cuda"``), copying only when it moves."""
    check_device(device)
    if device == "cpu":
        return _cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)
    return _cupy.asarray(array)


def to_numpy(array):
    """A NumPy array holding ``array``'s values (a copy when it lives on the GPU)."""
    return _cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)


def like(array, reference):
    """``array`` on the device of ``reference`` (masks and index arrays follow their tensor)."""
    if hasattr(array, "dtype") and is_cupy_array(reference) != is_cupy_array(array):
        return to_device(array, device_of(reference))
    return array


def scatter_add(target, index, values):
    """``target[index] += values`` with repeated indices accumulated (``np.add.at``)."""
    if is_cupy_array(target):
        import cupyx

        cupyx.scatter_add(target, index, values)
    else:
        numpy.add.at(target, index, values)
    return target


def cuda_runtime_major():
    """Major version of the CUDA runtime CuPy was built for (12, 13), or None without CuPy."""
    if _cupy is None:
        return None
    try:
        return _cupy.cuda.runtime.runtimeGetVersion() // 1000
    except Exception:
        return None


def scatter_add_rows(target, index, rows):
    """``target[index[i]] += rows[i]`` for a 1-D ``index`` and 2-D ``rows``, repeats added up.

    On the CPU the rows are sorted by index and summed per run with ``add.reduceat``:
    faster than ``numpy.add.at``, which handles one element at a time.
    """
    if is_cupy_array(target) or len(index) == 0:
        return scatter_add(target, index, rows)
    order = numpy.argsort(index, kind="stable")
    sorted_index = index[order]
    starts = numpy.flatnonzero(numpy.r_[True, sorted_index[1:] != sorted_index[:-1]])
    target[sorted_index[starts]] += numpy.add.reduceat(rows[order], starts, axis=0)
    return target


def raw_module(code, options, name_expressions):
    """A ``cupy.RawModule`` compiling ``code`` with NVRTC for the given template instantiations."""
    if _cupy is None:
        raise RuntimeError("CUDA kernels need CuPy: install the 'gpu' extra")
    return _cupy.RawModule(code=code, options=tuple(options), name_expressions=list(name_expressions))


def is_floating(dtype):
    return numpy.issubdtype(dtype, numpy.floating)
