"""Shared hypothesis strategies and value generators for the op tests.

Hypothesis draws shapes, axes and a seed; values come from
``numpy.random.default_rng(seed)``, shaped to stay away from the points where an
op is not differentiable.
"""

import math

import numpy
from hypothesis import strategies as st

import tinyformer

seeds = st.integers(0, 2**32 - 1)


@st.composite
def shapes(draw, min_dims=0, max_dims=4, max_side=4, max_size=48):
    """Shapes of ``min_dims..max_dims`` axes, each 1..max_side, at most ``max_size`` elements."""
    ndim = draw(st.integers(min_dims, max_dims))
    shape, size = [], 1
    for _ in range(ndim):
        side = draw(st.integers(1, max(1, min(max_side, max_size // size))))
        shape.append(side)
        size *= side
    return tuple(draw(st.permutations(shape)))


@st.composite
def broadcasts_to(draw, full):
    """A shape that broadcasts to ``full``: a trailing part of it (rank difference), some axes 1."""
    rank = draw(st.integers(0, len(full)))
    return tuple(1 if draw(st.booleans()) else n for n in full[len(full) - rank:])


@st.composite
def broadcastable_shapes(draw, num=2, min_dims=0, max_dims=4):
    """``num`` shapes that broadcast together."""
    full = draw(shapes(min_dims, max_dims))
    return [draw(broadcasts_to(full)) for _ in range(num)]


AXIS_KINDS = ("none", "int", "negative", "tuple")


def axes(ndim, kind):
    """An ``axis`` argument of the given kind for a tensor with ``ndim`` axes (ndim >= 1 unless "none")."""
    if kind == "none":
        return st.none()
    if kind == "int":
        return st.integers(0, ndim - 1)
    if kind == "negative":
        return st.integers(-ndim, -1)
    return st.lists(st.integers(0, ndim - 1), min_size=1, unique=True).flatmap(
        lambda chosen: st.tuples(*[st.sampled_from([a, a - ndim]) for a in chosen])
    )


@st.composite
def matmul_shapes(draw, rank_a, rank_b):
    """Operand shapes of the given ranks (1..4) whose batch axes broadcast, with size-1 axes."""
    n, k, m = (draw(st.integers(1, 3)) for _ in range(3))
    batch = draw(shapes(min_dims=max(rank_a, rank_b, 2) - 2, max_dims=max(rank_a, rank_b, 2) - 2,
                        max_side=3))

    def batch_of(rank):
        dims = batch[len(batch) - (rank - 2):] if rank > 2 else ()
        return tuple(1 if draw(st.booleans()) else d for d in dims)

    a = (k,) if rank_a == 1 else batch_of(rank_a) + (n, k)
    b = (k,) if rank_b == 1 else batch_of(rank_b) + (k, m)
    return a, b


def uniform(rng, shape, low=-2.0, high=2.0):
    return rng.uniform(low, high, shape)


def positive(rng, shape, low=0.2, high=3.0):
    return rng.uniform(low, high, shape)


def nonzero(rng, shape, low=0.5, high=2.0):
    """|values| in [low, high], either sign: safe denominators, away from kinks at 0."""
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(low, high, shape)


def avoiding(rng, shape, points, margin=0.1, low=-2.0, high=2.0):
    """Uniform values pushed at least ``margin`` away from every one of ``points``."""
    values = rng.uniform(low, high, shape)
    for p in points:
        offset = values - p
        values = numpy.where(numpy.abs(offset) < margin, p + numpy.copysign(margin, offset), values)
    return values


def distinct(rng, shape, spacing=0.25):
    """Values of both signs, pairwise at least ``spacing`` apart: no ties for max/min."""
    n = math.prod(shape)
    values = (rng.permutation(n) - n / 2) * spacing + rng.uniform(-0.1, 0.1)
    return values.reshape(shape)


def scalar(rng):
    """A Python float of either sign, magnitude in [0.5, 2]."""
    return float(nonzero(rng, ()))


def leaf(values, dtype=numpy.float64):
    return tinyformer.Tensor(numpy.asarray(values), requires_grad=True, dtype=dtype)
