# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, forward and the other names are the template's, where this function goes.

def backward(x, gain, bias, dy):
    """(dx, dgain, dbias): ∂L/∂x of x's shape, ∂L/∂gain and ∂L/∂bias (n,), given dy = ∂L/∂y."""
    mean = x.mean(axis=-1, keepdims=True)
    r = 1.0 / numpy.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + EPS)
    xhat = (x - mean) * r
    dxhat = dy * gain
    dx = r * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return dx, (dy * xhat).sum(axis=rows), dy.sum(axis=rows)
