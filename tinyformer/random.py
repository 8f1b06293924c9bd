"""Seeded randomness: one default generator for initialisation and dropout.

Every random draw in tinyformer (parameter initialisation, dropout masks) comes
from a ``numpy.random.Generator``: either one passed explicitly or the default
one, which ``manual_seed`` resets, so runs repeat exactly.
"""

import numpy

__all__ = ["manual_seed", "default_generator", "make_generator", "uniform_like", "get_rng_state",
           "set_rng_state"]

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

    Samples are drawn on the host from the seeded NumPy generator so a run
    repeats identically on CPU and GPU.
    """
    from . import backend

    samples = (generator or _default).random(shape, dtype=numpy.float32)
    return backend.like(samples, reference)


def get_rng_state():
    """The default generator's state (a JSON-serialisable dict), for checkpoints."""
    return _default.bit_generator.state


def set_rng_state(state):
    """Restore the default generator from ``get_rng_state()``: dropout then repeats exactly."""
    global _default
    generator = numpy.random.default_rng()
    generator.bit_generator.state = state
    _default = generator
