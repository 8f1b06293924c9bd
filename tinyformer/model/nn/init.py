"""Parameter initialisation, drawn from a seeded generator (see ``tinyformer.manual_seed``)."""

import math

from ...engine import backend
from ...engine.random import default_generator

__all__ = ["xavier_uniform", "packed_xavier_uniform", "fan_in_uniform", "normal", "zeros", "ones", "INIT_SCHEMES"]

# The initialisations of a Transformer's stacks (``TransformerConfig.init``). Embeddings (N(0, d_model^-0.5))
# and LayerNorms (gain 1, bias 0) are the same in both.
INIT_SCHEMES = {
    "xavier": "every projection matrix (W_Q, W_K, W_V, W_O, W_1, W_2) Xavier-uniform on its own shape, "
              "every bias zero",
    "torch": "PyTorch nn.Transformer's: W_Q, W_K, W_V Xavier-uniform as one packed (3 d_model, d_model) matrix "
             "(bound sqrt(6 / (4 d_model)), as MultiheadAttention's in_proj_weight), W_O, W_1, W_2 Xavier-uniform; "
             "attention biases zero, the feed-forward biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (nn.Linear's default)",
}


def xavier_uniform(fan_out, fan_in, generator=None):
    """U(−a, a) with a = √(6 / (fan_in + fan_out)) (Glorot & Bengio, 2010), shape (fan_out, fan_in)."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    rng = generator or default_generator()
    return rng.uniform(-bound, bound, size=(fan_out, fan_in)).astype(backend.DEFAULT_DTYPE)


def packed_xavier_uniform(parts, fan_out, fan_in, generator=None):
    """``parts`` matrices (fan_out, fan_in) cut from one Xavier-uniform (parts · fan_out, fan_in) matrix,
    whose bound √(6 / (fan_in + parts · fan_out)) is the packed shape's (PyTorch's in_proj_weight)."""
    packed = xavier_uniform(parts * fan_out, fan_in, generator)
    return [packed[i * fan_out:(i + 1) * fan_out].copy() for i in range(parts)]


def fan_in_uniform(size, fan_in, generator=None):
    """U(−1/√fan_in, 1/√fan_in) samples of ``size``: PyTorch's default ``nn.Linear`` bias."""
    bound = 1.0 / math.sqrt(fan_in)
    rng = generator or default_generator()
    return rng.uniform(-bound, bound, size=size).astype(backend.DEFAULT_DTYPE)


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
