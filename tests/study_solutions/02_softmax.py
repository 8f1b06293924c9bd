# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, forward and the other names are the template's, where this function goes.

def backward(x, dp):
    """dx = ∂L/∂x, of x's shape (..., n), given dp = ∂L/∂p of the same shape."""
    p = forward(x)
    return p * (dp - (dp * p).sum(axis=-1, keepdims=True))
