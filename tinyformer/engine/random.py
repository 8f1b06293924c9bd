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

__all__ = ["manual_seed", "default_generator", "make_generator", "drop_threshold", "fill_keep_mask",
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


#: bits of one dropout sample: four samples per 64-bit output of the bit generator
SAMPLE_BITS = 16
#: samples per block of ``fill_keep_mask`` (a multiple of 4): cache-resident while ``fn`` uses them
KEEP_BLOCK = 1 << 15


def drop_threshold(p):
    """The 16-bit threshold t of dropout probability ``p``: an element is dropped when its sample
    s < t, so it is dropped with probability t / 2¹⁶, ``p`` rounded to a multiple of 2⁻¹⁶
    (0.1 → 6554 / 65536 = 0.1000061); at most 65535."""
    return min(round(p * (1 << SAMPLE_BITS)), (1 << SAMPLE_BITS) - 1)


def fill_keep_mask(generator, p, keep, fn=None):
    """Fill the flat boolean array ``keep`` with a dropout keep mask, [s ≥ t] for 16-bit samples s
    and t = ``drop_threshold(p)``, from one draw of ``generator``, block by block, calling
    ``fn(start, stop)`` after each block of ``keep`` is made (while it is in cache).

    The samples are the raw output of the bit generator (``random_raw``) read as 16-bit integers,
    four per 64-bit output: element i takes bits 16·(i mod 4) to 16·(i mod 4) + 15 of output
    i // 4, and the draw takes ⌈n / 4⌉ outputs. Generating them costs a third of
    ``generator.random(n, float32)``'s two samples per output. Large draws from a PCG64 generator
    (the default) are split over the backend's threads: each thread jumps a copy of the generator to
    its first output (``advance``) and draws its part. The mask and the generator's final state do not
    depend on the number of threads. ``fn`` must only touch elements ``[start, stop)``.
    """
    from . import backend

    generator = generator or _default
    bit_generator = generator.bit_generator
    size = keep.size
    threshold = numpy.uint16(drop_threshold(p))
    threads = min(backend.get_num_threads(), size // backend.threads.ROW_BLOCK_MIN_ELEMENTS)
    if threads <= 1 or type(bit_generator) is not numpy.random.PCG64:
        _fill_keep_range(bit_generator, threshold, keep, 0, size, fn)
        return
    start_state = bit_generator.state
    words = -(-size // 4)
    bounds = [4 * (words * i // threads) for i in range(threads)] + [size]
    copies = []
    for first in bounds[:-1]:
        copy = numpy.random.PCG64()
        copy.state = start_state
        copies.append(copy.advance(first // 4))
    parts = list(zip(copies, bounds[:-1], bounds[1:]))  # as many as threads: one part per thread
    backend.map_row_blocks(lambda a, b: [_fill_keep_range(c, threshold, keep, *ab, fn) for c, *ab in parts[a:b]],
                           len(parts), None, min_elements=1)
    end_state = copies[-1].state
    # advance drops a buffered half output (kept for ``random(float32)``); drawing raw keeps it
    end_state["has_uint32"], end_state["uinteger"] = start_state["has_uint32"], start_state["uinteger"]
    bit_generator.state = end_state


def _fill_keep_range(bit_generator, threshold, keep, start, stop, fn):
    for first in range(start, stop, KEEP_BLOCK):
        last = min(first + KEEP_BLOCK, stop)
        raw = bit_generator.random_raw(-(-(last - first) // 4)).astype("<u8", copy=False)  # the same on any byte order
        samples = raw.view("<u2")[: last - first]
        numpy.greater_equal(samples, threshold, out=keep[first:last])
        if fn is not None:
            fn(first, last)


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
    returns a slot of the graph's seed table (a ``kernels.arguments.DeviceSeed``), which the kernel
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
