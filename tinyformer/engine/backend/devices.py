"""Arrays and devices: NumPy on the CPU, CuPy on the GPU.

The only module of the backend that imports ``cupy`` (``cupy``: the module, or None without it).
Everything else asks it for the array module of the arrays at hand (``get_array_module``), the way
Chainer and CuPy code does, so the same op code runs on either device; it moves arrays between
the devices (never inside a captured step) and holds the array helpers that differ between them.
"""

import functools
import math
import os

import numpy

from .capture import check_not_capturing

try:  # CuPy is optional: the ``gpu`` extra.
    import cupy
except Exception:  # ImportError, or a broken CUDA install raising at import time.
    cupy = None

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
            _gpu_available = cupy is not None and bool(cupy.is_available())
        except Exception:
            _gpu_available = False
    return _gpu_available


def is_cupy_array(array):
    return cupy is not None and isinstance(array, cupy.ndarray)


def get_array_module(*arrays):
    """``cupy`` if any argument is a CuPy array, else ``numpy``."""
    if cupy is not None:
        for a in arrays:
            if isinstance(a, cupy.ndarray):
                return cupy
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
    """Return ``array`` on ``device`` (``"cpu"`` or ``"cuda"``), copying only when it moves (never
    inside a captured step: ``check_not_capturing``)."""
    if device != device_of(array):
        check_not_capturing(f"a copy to {device} (backend.to_device)")
    check_device(device)
    if device == "cpu":
        return cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)
    return cupy.asarray(array)


def to_numpy(array):
    """A NumPy array holding ``array``'s values (a copy when it lives on the GPU); refused while a
    CUDA graph is captured (``capturing``: a read-back there would freeze one step's value)."""
    check_not_capturing("backend.to_numpy reads a value back to the host")
    return cupy.asnumpy(array) if is_cupy_array(array) else numpy.asarray(array)


def like(array, reference):
    """``array`` on the device of ``reference`` (masks and index arrays follow their tensor)."""
    if hasattr(array, "dtype") and is_cupy_array(reference) != is_cupy_array(array):
        return to_device(array, device_of(reference))
    return array


def erf(x):
    """The error function element-wise, in x's type: ``cupyx.scipy.special.erf`` on the GPU; on the CPU
    (NumPy has none) Python's ``math.erf`` per element, in float64: exact, at about 0.1 µs a value."""
    if is_cupy_array(x):
        import cupyx.scipy.special

        return cupyx.scipy.special.erf(x)
    values = numpy.frompyfunc(math.erf, 1, 1)(numpy.asarray(x, dtype=numpy.float64))
    return numpy.asarray(values, dtype=numpy.float64).astype(x.dtype, copy=False)


def scatter_add(target, index, values):
    """``target[index] += values`` with repeated indices accumulated (``np.add.at``)."""
    get_array_module(target).add.at(target, index, values)
    return target


def cuda_runtime_major():
    """Major version of the CUDA runtime CuPy was built for (12, 13), or None without CuPy."""
    if cupy is None:
        return None
    try:
        return cupy.cuda.runtime.runtimeGetVersion() // 1000
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


MAX_CAPABILITY = "TINYFORMER_MAX_CAPABILITY"
"""The environment variable capping the capability the engine sees (``sm_75``: a T4's kernel paths on
a bigger GPU, or in the CPU emulation); unset or empty: no cap."""


def capability_number(arch, what="compute capability"):
    """75 for ``"sm_75"`` (also ``"75"``, ``"7.5"``); a one-line ValueError naming ``what`` otherwise."""
    text = str(arch).strip().lower()
    text = text[3:] if text.startswith("sm_") else text
    major, dot, minor = text.partition(".")
    digits = major + minor if dot else text
    if not digits.isdigit() or not 2 <= len(digits) <= 3 or (dot and len(minor) != 1):
        raise ValueError(f"{what} must look like sm_75 (or 7.5), got {arch!r}")
    return int(digits)


def capped_capability(arch):
    """``arch`` (``"sm_90"``) lowered to ``$TINYFORMER_MAX_CAPABILITY`` where that is set and lower."""
    return _capped(arch, os.environ.get(MAX_CAPABILITY, ""))


@functools.lru_cache(maxsize=64)
def _capped(arch, cap):
    """``capped_capability`` once per (architecture, variable's value): asked at every kernel launch."""
    cap = cap.strip()
    if not cap or arch is None:
        return arch
    limit = capability_number(cap, f"${MAX_CAPABILITY}")
    return f"sm_{min(capability_number(arch), limit)}"


def compute_capability(capped=True):
    """The current CuPy device's architecture as NVRTC names it (``"sm_90"``), capped by
    ``$TINYFORMER_MAX_CAPABILITY`` (the kernel paths' choice) unless ``capped`` is False (the
    binaries' architecture); None without a GPU. The one place the engine reads it."""
    if not is_gpu_available():
        return None
    arch = _device_arch(cupy.cuda.runtime.getDevice())
    return capped_capability(arch) if capped else arch


@functools.lru_cache(maxsize=None)
def _device_arch(device_id):
    return f"sm_{cupy.cuda.Device(device_id).compute_capability}"


def device_name():
    """The GPU's name as the driver reports it (``"Tesla T4"``), or None without a GPU."""
    if not is_gpu_available():
        return None
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def device_facts():
    """What ``tinyformer info`` says of CuPy and the GPU: {"cupy": version or None, "cuda_runtime",
    "cuda_driver": "12.4" or None, "name", "capability" (the device's own), "memory_total",
    "memory_free": bytes or None}."""
    facts = dict.fromkeys(("cupy", "cuda_runtime", "cuda_driver", "name", "capability", "memory_total",
                           "memory_free"))
    if cupy is None:
        return facts
    facts["cupy"] = cupy.__version__

    def version(number):
        return f"{number // 1000}.{number % 1000 // 10}"

    try:
        facts["cuda_runtime"] = version(cupy.cuda.runtime.runtimeGetVersion())
        facts["cuda_driver"] = version(cupy.cuda.runtime.driverGetVersion())
    except Exception:  # no driver: the versions CuPy was built for are still worth saying
        pass
    if is_gpu_available():
        facts["name"], facts["capability"] = device_name(), compute_capability(capped=False)
        facts["memory_free"], facts["memory_total"] = cupy.cuda.runtime.memGetInfo()
    return facts


def load_module(path):
    """A ``cupy.RawModule`` of the compiled module (a cubin) at ``path``."""
    if cupy is None:
        raise RuntimeError("CUDA kernels need CuPy: install the 'gpu' extra")
    return cupy.RawModule(path=path)


def raw_module(code, options, name_expressions):
    """A ``cupy.RawModule`` compiling ``code`` with NVRTC for the given template instantiations."""
    if cupy is None:
        raise RuntimeError("CUDA kernels need CuPy: install the 'gpu' extra")
    return cupy.RawModule(code=code, options=tuple(options), name_expressions=list(name_expressions))


def copy_into(target, source):
    """Copy the host array ``source`` into the array ``target`` in place (on the current stream
    for a CuPy ``target``): the static inputs of a captured graph keep their memory. Not inside a
    capture (``check_not_capturing``): the copy would be replayed from a stale host buffer."""
    check_not_capturing("a host-to-device copy (backend.copy_into)")
    if is_cupy_array(target):
        host = numpy.require(numpy.asarray(source, dtype=target.dtype).reshape(target.shape), requirements="C")
        target.set(host, stream=cupy.cuda.get_current_stream())
    else:
        numpy.copyto(target, source, casting="same_kind")
