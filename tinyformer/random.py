"""Seeded randomness: one default generator for initialisation and dropout.

Every random draw in tinyformer (parameter initialisation, dropout masks) comes
from a ``numpy.random.Generator``: either one passed explicitly or the default
one, which ``manual_seed`` resets, so runs repeat exactly. On the GPU with the
kernels on, dropout and the fused attention's dropout draw only a seed from it
and make their masks on the device with Philox (``kernels/philox.cuh``): a GPU
run repeats for a seed, but its masks are not the CPU run's.
"""

import contextlib

import numpy

__all__ = ["manual_seed", "default_generator", "make_generator", "uniform_like", "uniform_blocks",
           "get_rng_state", "set_rng_state", "kernel_seed", "recording_kernel_seeds", "kernel_seed_recorder",
           "draw_kernel_seeds"]

_default = numpy.random.default_rng(0)


def manual_seed(seed):
    """Reset the default generator to ``seed`` (initialisation and dropout repeat)."""
    global _default
    _default = numpy.random.default_rng(seed)
    return _default


def make_generator(seed):
    """A new generator of its own, seeded with ``seed``."""
    return numpy.random.default_rng(seed)


def default_generator():
    return _default


def uniform_like(generator, shape, reference):
    """Uniform [0, 1) samples of ``shape`` from ``generator``, on ``reference``'s device.

    Samples are drawn on the host from the seeded NumPy generator and copied to
    the device, so wherever they are used a run repeats identically on CPU and GPU.
    Dropout on the GPU with the kernels on does not use them: its masks come from
    Philox on the device (``kernels/dropout.cu``), keyed by a seed drawn from the
    same generator, so GPU runs repeat exactly for a seed but differ from CPU runs
    when dropout > 0.
    """
    from . import backend

    samples = (generator or _default).random(shape, dtype=numpy.float32)
    return backend.like(samples, reference)


#: samples per block of ``uniform_blocks``: 128 KB of float32, cache-resident while ``fn`` uses them
UNIFORM_BLOCK = 1 << 15


def uniform_blocks(generator, size, fn):
    """Feed one draw of ``size`` uniform float32 samples to ``fn(start, stop, samples)``, block by
    block, without holding the whole draw: the samples are exactly those of
    ``generator.random(size, dtype=numpy.float32)``, and the generator ends where that call
    would have left it.

    Large draws from a PCG64 generator (the default) are split over the backend's threads:
    each thread jumps a copy of the generator to its first sample (PCG64 yields two float32
    samples per 64-bit step; ``advance`` skips steps) and draws its part into its own small
    buffer. ``fn`` must only write its own elements ``[start, stop)``.
    """
    from . import backend

    generator = generator or _default
    bit_generator = generator.bit_generator
    done = 0
    if size and bit_generator.state.get("has_uint32"):  # half a 64-bit step is buffered: use it first
        fn(0, 1, generator.random(1, dtype=numpy.float32))
        done = 1
    threads = min(backend.get_num_threads(), (size - done) // backend.ROW_BLOCK_MIN_ELEMENTS)
    if threads <= 1 or type(bit_generator) is not numpy.random.PCG64:
        _uniform_range(generator, done, size, fn)
        return
    start_state = bit_generator.state
    bounds = [done + 2 * ((size - done) * i // (2 * threads)) for i in range(threads)] + [size]
    copies = []
    for first in bounds[:-1]:
        copy = numpy.random.PCG64()
        copy.state = start_state
        copies.append(numpy.random.Generator(copy.advance((first - done) // 2)))
    parts = list(zip(copies, bounds[:-1], bounds[1:]))  # as many as threads: one part per thread
    backend.map_row_blocks(lambda first, last: [_uniform_range(*part, fn) for part in parts[first:last]],
                           len(parts), None, min_elements=1)
    bit_generator.state = copies[-1].bit_generator.state


def _uniform_range(generator, start, stop, fn):
    buffer = numpy.empty(min(UNIFORM_BLOCK, max(stop - start, 0)), dtype=numpy.float32)
    for first in range(start, stop, UNIFORM_BLOCK):
        last = min(first + UNIFORM_BLOCK, stop)
        samples = buffer[: last - first]
        generator.random(dtype=numpy.float32, out=samples)
        fn(first, last, samples)


def get_rng_state():
    """The default generator's state (a JSON-serialisable dict), for checkpoints."""
    return _default.bit_generator.state


def set_rng_state(state):
    """Restore the default generator from ``get_rng_state()``: dropout then repeats exactly."""
    global _default
    generator = numpy.random.default_rng()
    generator.bit_generator.state = state
    _default = generator


_seed_recorder = None


def kernel_seed(generator=None):
    """The seed of one kernel's Philox stream, drawn from ``generator`` (None: the default one).

    While a CUDA graph is captured (``recording_kernel_seeds``) nothing is drawn: the recorder
    returns a slot of the graph's seed table (a ``kernels.ops.DeviceSeed``), which the kernel
    reads on the device and the graph's owner fills before every replay with the draws this call
    would have made, in the same order: a replayed step uses the masks of the eager step.
    """
    if _seed_recorder is not None:
        return _seed_recorder(generator)
    return _draw_seed(generator)


def _draw_seed(generator):
    return int((generator or _default).integers(2 ** 63))


@contextlib.contextmanager
def recording_kernel_seeds(recorder):
    """Route every ``kernel_seed(generator)`` call to ``recorder(generator)`` (None for the default
    generator, which is looked up again at each replay: ``manual_seed`` and ``set_rng_state``
    replace it)."""
    global _seed_recorder
    outer, _seed_recorder = _seed_recorder, recorder
    try:
        yield
    finally:
        _seed_recorder = outer


def kernel_seed_recorder():
    """The recorder ``kernel_seed`` calls now (``recording_kernel_seeds``), or None: it draws."""
    return _seed_recorder


def draw_kernel_seeds(generators):
    """One ``kernel_seed`` draw per entry of ``generators`` (None: the default generator), in
    order, as a uint64 array."""
    return numpy.array([_draw_seed(g) for g in generators], dtype=numpy.uint64)
