"""The case of embedding.cu: its launcher against a float64 scatter add."""

import numpy

from ...engine import backend
from ...engine.kernels import embedding as embedding_kernel
from .harness import KernelRun, rand, shape_label


def embedding(dev, positions, vocab, cols, seed=0):
    """embedding.cu against the scatter add of dy's rows into their ids' rows in float64 (ids drawn
    with repeats, so some rows sum many terms and some none); ``results["grad w"]`` for the
    determinism tests."""
    rng = numpy.random.default_rng(seed)
    ids = rng.integers(0, vocab, positions)
    g = dev.round(rand(rng, positions, cols))
    expected = numpy.zeros((vocab, cols))
    numpy.add.at(expected, ids, g.astype(numpy.float64))
    kernel = embedding_kernel.embedding_backward(backend.to_device(ids, dev.device), dev.put(g), vocab)
    return KernelRun(f"ids ({positions},) of {vocab}, dy {shape_label(g)}",
                     [dev.gradient("grad w", kernel, expected, atol=1e-5 * max(1, positions / vocab))],
                     {"grad w": dev.get(kernel)})
