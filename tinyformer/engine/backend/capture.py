"""The region of a CUDA graph capture: what may not run inside it, and what the NumPy reference's
outputs become there.

Inside ``capturing()`` nothing may read a value back to the host (``check_not_capturing``): a
captured step would freeze one step's value for every replay. ``capturing(memory=...)`` is the
one seam through which a capture whose device memory is not CuPy's reaches the engine
(``captured_memory``; docs/cuda-graphs.md). ``counting_launches()`` counts the launches the engine
issues in a block, by family, whatever the capture's memory.
"""

import collections
import contextlib
import dataclasses

import numpy

_capturing = False
_captured_memory = None  # the memory function of the capture in progress (``capturing(memory=...)``)
_launch_counts = []  # the Counters of the enclosing ``counting_launches()`` blocks, innermost last


@contextlib.contextmanager
def capturing(memory=None):
    """A region whose device work is being captured into a CUDA graph (``GraphCapture.capture``):
    nothing in it may read a value back to the host, so checks that would (the id range checks,
    for instance) are left to the caller, who checked the inputs on the host (``is_capturing``).

    ``memory`` is the one seam through which a capture whose device memory is not CuPy's reaches
    the engine: a function taking a NumPy array made on the host by an op's NumPy reference inside
    the region and returning it as memory of the captured step (``captured_memory``). CuPy's
    capture passes none (the reference's outputs are CuPy arrays already). Such a capture is chosen
    through ``translation.train.graphs.open_capture``; the tests run the graph step without a GPU
    on one whose memory is NumPy arrays (docs/cuda-graphs.md)."""
    global _capturing, _captured_memory
    outer = _capturing, _captured_memory
    _capturing, _captured_memory = True, memory
    try:
        yield
    finally:
        _capturing, _captured_memory = outer


def is_capturing():
    """True inside ``capturing()``."""
    return _capturing


def captured_memory(out):
    """The outputs of an op's NumPy reference (an array, None or a tuple of them) as memory of the
    step being captured: each NumPy array through the ``memory`` function of the enclosing
    ``capturing(memory=...)``; without one (outside a capture, or CuPy's), as they are."""
    memory = _captured_memory
    if memory is None:
        return out
    if type(out) is tuple:
        return tuple(memory(o) if isinstance(o, numpy.ndarray) else o for o in out)
    return memory(out) if isinstance(out, numpy.ndarray) else out


class LaunchCounts(collections.Counter):
    """Launches by family (a ``collections.Counter``), and ``records``: one ``Launch`` per launch, in
    order, with the bytes it moves and the FLOPs it does where its seam knows them."""

    def __init__(self):
        super().__init__()
        self.records = []


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch: its family, the bytes it reads and writes (each operand once: the least it must
    move), its FLOPs, and ``compute``: which peak they run at (``"fp32"``, ``"fp64"``, ``"tensor"``
    for 16-bit products on tensor cores, or ``"memory"`` for work bound by bytes alone)."""

    family: str
    bytes: int = 0
    flops: int = 0
    compute: str = "memory"


@contextlib.contextmanager
def counting_launches():
    """A ``LaunchCounts`` of the launches issued in the block through the engine's seams, by
    family: each kernel of ``engine.kernels`` under its name (``"softmax_forward"``), each cuBLAS
    product as ``"cublas_gemm"``, and whatever the capture in progress counts of its own (one
    whose memory is not CuPy's may count the array operations on that memory, which CuPy would
    launch as kernels of its own). The same seams count on a GPU and on the CPU, so a step's
    launches, and the bytes and FLOPs they stand for, are known before any device; on a GPU
    ``GraphCapture.kernel_nodes`` gives the graph's own count."""
    counts = LaunchCounts()
    _launch_counts.append(counts)
    try:
        yield counts
    finally:
        _launch_counts.remove(counts)


def is_counting_launches():
    """True inside ``counting_launches()``: work is then issued as a device issues it, one launch an
    operation (``threads.map_row_blocks`` and ``blockwise`` do not split NumPy work into row blocks,
    which a count would take for launches of their own)."""
    return bool(_launch_counts)


def note_launch(family, count=1, bytes=0, flops=0, compute="memory"):  # noqa: A002 - the cost's own word
    """Count ``count`` launches of ``family`` in every enclosing ``counting_launches()`` block, each
    moving ``bytes`` and doing ``flops`` (``Launch``)."""
    if not _launch_counts:
        return
    launch = Launch(family, int(bytes), int(flops), compute)
    for counts in _launch_counts:
        counts[family] += count
        counts.records.extend([launch] * count)


def check_not_capturing(what):
    """Raise ``CaptureUnavailable(what)`` inside ``capturing()``: the host-synchronising calls
    (``to_numpy``, ``Tensor.item``, host-to-device copies) say so, instead of capturing one step's
    value for every replay."""
    if _capturing:
        raise CaptureUnavailable(f"{what} inside a captured step")


class CaptureUnavailable(RuntimeError):
    """CUDA graphs cannot be used here; the message says why (the step then runs eagerly)."""

