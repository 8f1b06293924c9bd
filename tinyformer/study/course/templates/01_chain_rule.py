"""Exercise 1 of `tinyformer study`: the chain rule on a small graph.

The forward pass is given below; you write ``backward``. A loss L far downstream depends on
``out``; backward receives d_out = ∂L/∂out (random in the checker, as any upstream layer would
send) and returns ∂L/∂x, ∂L/∂w and ∂L/∂b.

    z   = x W + b      x (n, d), W (d, d), b (d,): b is added to every one of the n rows
    h   = tanh(z)      (n, d)
    y   = h ∘ x        (n, d)   ∘ is elementwise; x is used a second time here
    out = Σⱼ yᵢⱼ       (n,)     each row summed

Walk the graph backwards, one node at a time, from d_out to each input:

* a sum over an axis hands each summed element the upstream gradient of its sum: d_out goes
  back over that axis by broadcasting;
* y = h ∘ x: the gradient of each factor is the upstream gradient times the other factor;
* tanh's derivative can be written with tanh's own output, h;
* z = x W: the gradient of each operand is the upstream gradient multiplied by the other operand,
  transposed, on the side that makes the shapes fit (work out the shapes: dW must be (d, d) as W
  is, with dW[i, j] = ∂L/∂W[i, j]);
* b was broadcast over the n rows: every row sends it a gradient;
* x reaches out along two paths, through z and through y: its gradient is the sum of what the
  two paths send back.

Check your backward with ``tinyformer study check 01_chain_rule.py``.
"""

import numpy

EXERCISE = 1  # which exercise this file holds; `tinyformer study check` reads it


def forward(x, w, b):
    """out (n,) = Σⱼ (tanh(x W + b) ∘ x)ᵢⱼ for x (n, d), w (d, d), b (d,)."""
    z = x @ w + b
    h = numpy.tanh(z)
    y = h * x
    return y.sum(axis=1)


def backward(x, w, b, d_out):
    """(dx, dw, db): ∂L/∂x (n, d), ∂L/∂w (d, d), ∂L/∂b (d,), given d_out = ∂L/∂out (n,).

    Recompute what you need of the forward pass (z, h) here."""
    raise NotImplementedError("write backward")
