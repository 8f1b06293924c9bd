# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, forward and the other names are the template's, where this function goes.

def backward(q, k, v, mask, causal, d_out):
    """(dQ, dK, dV) of the shapes of q, k and v, given d_out = ∂L/∂O (batch, len_q, d_v)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2) * scale
    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), s, -numpy.inf)
    p = softmax(s)
    dv = p.swapaxes(-1, -2) @ d_out
    dp = d_out @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = ds @ k * scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    return dq, dk, dv
