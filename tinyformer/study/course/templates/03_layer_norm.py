"""Exercise 3 of `tinyformer study`: layer normalisation, with its gain and bias.

The forward pass is given below; you write ``backward``. Over the last axis of n features
(Ba et al., 2016; the Transformer's "Add & Norm", §3.1):

    μ  = (1/n) Σⱼ xⱼ                  σ² = (1/n) Σⱼ (xⱼ − μ)²      (biased: divided by n)
    r  = 1 / √(σ² + ε)                x̂ = (x − μ) · r                ε = EPS
    y  = x̂ ∘ gain + bias              gain and bias (n,), the same for every row

backward receives dy = ∂L/∂y (random in the checker) and returns (dx, dgain, dbias).

* gain and bias are shared by every row: their gradients sum over all leading axes, shape (n,);
* dx̂ = dy ∘ gain is the easy part. x̂ then depends on each xⱼ three ways: directly, through μ
  and through σ² (r). Work out ∂μ/∂xⱼ and ∂σ²/∂xⱼ, apply the chain rule along each path and
  collect the terms: the result fits on one line with r, dx̂, x̂ and two means over the row;
* a row of a single feature (n = 1) has x̂ = 0 and y = bias whatever x is: what is dx there?

Check your backward with ``tinyformer study check 03_layer_norm.py``.
"""

import numpy

EXERCISE = 3  # which exercise this file holds; `tinyformer study check` reads it
EPS = 1e-5  # ε, inside the square root (as tinyformer's LayerNorm)


def forward(x, gain, bias):
    """y = (x − μ) / √(σ² + ε) ∘ gain + bias over the last axis; x (..., n), gain and bias (n,)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    xhat = (x - mean) / numpy.sqrt(var + EPS)
    return xhat * gain + bias


def backward(x, gain, bias, dy):
    """(dx, dgain, dbias): ∂L/∂x of x's shape, ∂L/∂gain and ∂L/∂bias (n,), given dy = ∂L/∂y."""
    raise NotImplementedError("write backward")
