"""tinyformer: the Transformer of "Attention Is All You Need", from scratch on NumPy/CuPy.

The public surface: ``Tensor`` and its ops, ``no_grad``, the gradient checker,
the fused ops (``functional``), the layers (``nn``), ``optim`` and the array backend; and the
short paths to a trained model, imported on first use (``_LAZY``):

    import tinyformer as tf
    model, tokenizer, _ = tf.load_model("runs/synthetic-tiny")     # a run's folder or a checkpoint
    tf.translate(model, tokenizer, ["I see 3 red cats"])           # beam 4, alpha 0.6 (§6.1)
    tf.explain(model, tokenizer, "I see 3 red cats").save("explain.html")
"""

from importlib import import_module as _import_module

# before anything loads NumPy (and with it OpenBLAS): see common/blas_spin.py
from .common import blas_spin  # noqa: F401  (isort: skip)
from .common import filecache, validation
from .engine import amp, backend, functional, kernels, ops, random
from .model import nn, optim
from .engine.random import manual_seed
from .engine.gradcheck import GradcheckError, GradcheckReport, gradcheck
from .engine.ops import (
    abs,
    broadcast_to,
    clip,
    concat,
    exp,
    log,
    masked_fill,
    matmul,
    max,
    mean,
    min,
    relu,
    gelu,
    silu,
    reshape,
    sqrt,
    stack,
    sum,
    swapaxes,
    tanh,
    transpose,
    var,
    where,
)
from .common.version import __version__
from .engine.tensor import Function, Tensor, backward, enable_grad, grad, is_grad_enabled, no_grad



def tensor(data, requires_grad=False, dtype=None):
    """Shorthand for ``Tensor(data, requires_grad, dtype)``."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


# name -> the module (below this package) that defines it; None: the name is that module itself.
# They load on first use: the translation and study layers bring sacreBLEU, sentencepiece and
# the decoder, which would double the time of ``import tinyformer`` for users of the engine alone.
_LAZY = {
    "load_model": "translation.train",  # (model in eval mode, tokenizer, metadata)
    "translate": "translation.decode",  # text lines in, one translation each out
    "explain": "study.viz",  # one sentence's explain page (an ExplainPage: shows inline in Jupyter)
    "translation": None,
    "study": None,
}


def __getattr__(name):
    """A name of ``_LAZY``, imported on first use and kept (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = _import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
