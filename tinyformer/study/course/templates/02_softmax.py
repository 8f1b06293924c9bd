"""Exercise 2 of `tinyformer study`: softmax along the last axis.

The forward pass is given below; you write ``backward``. Every row (the last axis) of x becomes
a probability distribution:

    pᵢ = exp(xᵢ) / Σⱼ exp(xⱼ)      over the n entries of one row

(forward subtracts the row's maximum first: the same p, without overflow). backward receives
dp = ∂L/∂p (random in the checker) and returns dx = ∂L/∂x.

Derive it on one row, then write it for all rows at once:

* ∂pᵢ/∂xⱼ has two cases, i = j and i ≠ j; write both with pᵢ, pⱼ and δᵢⱼ (1 if i = j, else 0);
* dxⱼ = Σᵢ dpᵢ · ∂pᵢ/∂xⱼ: the sum over i leaves a term of j alone and one number per row, shared
  by every entry of that row. Which sum is that number, and over which axis?
* softmax's backward needs only its output p (p = forward(x) gets it again), not x;
* an entry of x at −inf (a masked score, as attention makes them) has p = 0: your dx must give
  it 0 too;
* x may have any number of leading axes (rows of rows): sum over the last one only, and keep it
  (keepdims=True) so that the per-row number lines up with its own row.

Check your backward with ``tinyformer study check 02_softmax.py``.
"""

import numpy

EXERCISE = 2  # which exercise this file holds; `tinyformer study check` reads it


def forward(x):
    """p = softmax(x) along the last axis; x of any shape (..., n), no row entirely −inf."""
    e = numpy.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def backward(x, dp):
    """dx = ∂L/∂x, of x's shape (..., n), given dp = ∂L/∂p of the same shape."""
    raise NotImplementedError("write backward")
