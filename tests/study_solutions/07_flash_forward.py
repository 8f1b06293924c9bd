# tinyformer's reference solution of this exercise: its forward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, math, seen, record and BLOCK are the template's, where this function goes.

def forward(q, k, v, key_lengths=None, causal=False, block=BLOCK):
    """(O, lse) of attention over key tiles of ``block`` keys, never S whole."""
    scale = 1 / math.sqrt(q.shape[-1])
    batch, len_q, len_k = q.shape[0], q.shape[1], k.shape[1]
    o = numpy.zeros((batch, len_q, v.shape[-1]))
    lse = numpy.full((batch, len_q), -numpy.inf)
    for b in range(batch):
        length = len_k if key_lengths is None else min(int(key_lengths[b]), len_k)
        for i0 in range(0, len_q, block):
            i1 = min(i0 + block, len_q)
            m = numpy.full(i1 - i0, -numpy.inf)
            l = numpy.zeros(i1 - i0)
            acc = numpy.zeros((i1 - i0, v.shape[-1]))
            end = min(length, i1 + len_k - len_q) if causal else length
            for j0 in range(0, end, block):
                j1 = min(j0 + block, len_k)
                s = q[b, i0:i1] @ k[b, j0:j1].T * scale
                s = numpy.where(seen(len_q, len_k, length, causal, numpy.arange(i0, i1), numpy.arange(j0, j1)),
                                s, -numpy.inf)
                m_new = numpy.maximum(m, s.max(axis=1))
                base = numpy.where(numpy.isfinite(m_new), m_new, 0.0)  # nothing seen yet: every p is 0
                p = numpy.exp(s - base[:, None])
                correction = numpy.exp(m - base)
                l = l * correction + p.sum(axis=1)
                acc = acc * correction[:, None] + p @ v[b, j0:j1]
                m = m_new
                record(b, i0, j0 // block, m, l)
            some = l > 0
            o[b, i0:i1] = numpy.where(some[:, None], acc / numpy.where(some, l, 1.0)[:, None], 0.0)
            lse[b, i0:i1] = numpy.where(some, m + numpy.log(numpy.where(some, l, 1.0)), -numpy.inf)
    return o, lse
