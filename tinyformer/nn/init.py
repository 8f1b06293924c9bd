"""Parameter initialisation, drawn from a seeded generator (see ``tinyformer.manual_seed``)."""

import math

from .. import backend
from ..random import default_generator

__all__ = ["xavier_uniform", "normal", "zeros", "ones"]


def xavier_uniform(fan_out, fan_in, generator=None):
    """U(−a, a) with a = √(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010), shape (fan_out, fan_in)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    rng = generator or default_generator()
    return rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(backend.DEFAULT_DTYPE)


def normal(shape, std, generator=None):
    """N(0, std²) samples of ``shape``."""
    rng = generator or default_generator()
    return (rng.standard_normal(shape) * std).astype(backend.DEFAULT_DTYPE)


def zeros(shape):
    import numpy

    return numpy.zeros(shape, dtype=backend.DEFAULT_DTYPE)


def ones(shape):
    import numpy

    return numpy.ones(shape, dtype=backend.DEFAULT_DTYPE)
