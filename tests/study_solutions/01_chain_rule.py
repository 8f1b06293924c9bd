# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, forward and the other names are the template's, where this function goes.

def backward(x, w, b, d_out):
    """(dx, dw, db): ∂L/∂x (n, d), ∂L/∂w (d, d), ∂L/∂b (d,), given d_out = ∂L/∂out (n,).

    Recompute what you need of the forward pass (z, h) here."""
    z = x @ w + b
    h = numpy.tanh(z)
    dy = numpy.broadcast_to(d_out[:, None], x.shape)  # the row sum sends d_out to every element of its row
    dh = dy * x
    dz = dh * (1.0 - h ** 2)
    dx = dz @ w.T + dy * h  # x's two paths: through z = x W + b and through y = h ∘ x
    dw = x.T @ dz
    db = dz.sum(axis=0)
    return dx, dw, db
