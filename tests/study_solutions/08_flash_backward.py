# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, math, seen and BLOCK are the template's, where this function goes.

def backward(q, k, v, o, lse, d_out, key_lengths=None, causal=False, block=BLOCK):
    """(dQ, dK, dV) given d_out = ∂L/∂O, from the forward's o and lse, one tile at a time."""
    scale = 1 / math.sqrt(q.shape[-1])
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    dq, dk, dv = numpy.zeros(q.shape), numpy.zeros(k.shape), numpy.zeros(v.shape)
    delta = (d_out * o).sum(axis=-1)
    for b in range(batch):
        length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
        for j0 in range(0, length, block):
            j1 = min(j0 + block, len_k)
            first = max(0, j0 - (len_k - len_q)) // block * block if causal else 0
            for i0 in range(first, len_q, block):
                i1 = min(i0 + block, len_q)
                s = q[b, i0:i1] @ k[b, j0:j1].T * scale
                hidden = ~seen(len_q, len_k, length, causal, numpy.arange(i0, i1), numpy.arange(j0, j1))
                row_lse = lse[b, i0:i1, None]
                p = numpy.exp(numpy.where(hidden | numpy.isinf(row_lse), -numpy.inf, s - row_lse))
                dv[b, j0:j1] += p.T @ d_out[b, i0:i1]
                dp = d_out[b, i0:i1] @ v[b, j0:j1].T
                ds = p * (dp - delta[b, i0:i1, None])
                dq[b, i0:i1] += ds @ k[b, j0:j1] * scale
                dk[b, j0:j1] += ds.T @ q[b, i0:i1] * scale
    return dq, dk, dv
