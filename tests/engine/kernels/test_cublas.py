"""kernels/cublas.py's plans, checked on the CPU: each ``GemmPlan`` is carried out as cuBLAS reads
it (column-major matrices at the plan's leading dimensions and batch strides, over the operands'
own memory, NumPy's ``as_strided``) and compared with NumPy's product. The GPU runs the same plans
through cuBLAS (engine/kernels/test_emulation.py, the graph tests)."""

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from tinyformer.engine.kernels import cublas


def element_strides(x):
    return tuple(s // x.itemsize for s in x.strides)


def stored(x, operand, count, rows, cols):
    """The (count, rows, cols) column-major matrices cuBLAS reads from x's memory for ``operand``."""
    return as_strided(x, shape=(count, rows, cols),
                      strides=(operand.stride * x.itemsize, x.itemsize, operand.ld * x.itemsize))


def carried_out(a, b):
    """a @ b as cuBLAS computes it from gemm_plan (Cᵀ = op(B)·op(A), column major), or None."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = np.broadcast_to(a, batch + a.shape[-2:]), np.broadcast_to(b, batch + b.shape[-2:])
    plan = cublas.gemm_plan(a.shape, element_strides(a), b.shape, element_strides(b))
    if plan is None:
        return None
    m, n, k, count = plan.m, plan.n, plan.k, plan.count
    first = stored(b, plan.b, count, *((k, n) if plan.b.transposed else (n, k)))
    second = stored(a, plan.a, count, *((m, k) if plan.a.transposed else (k, m)))
    def op(x, transposed):
        return x.transpose(0, 2, 1) if transposed else x

    c_t = op(first, plan.b.transposed) @ op(second, plan.a.transposed)  # (count, n, m)
    return c_t.transpose(0, 2, 1).reshape(batch + (m, n))


rng = np.random.default_rng(0)


def r(*shape):
    return rng.standard_normal(shape)


#: name -> the operands, made by r(*shape) (NumPy here; on the GPU, engine/kernels/test_emulation.py's CuPy arrays)
LAYOUTS = {
    "C @ C": lambda r: (r(5, 3), r(3, 4)),
    "C @ W.T (a linear layer)": lambda r: (r(6, 3), r(4, 3).T),
    "g.T @ x (its weight gradient)": lambda r: (r(6, 4).T, r(6, 3)),
    "a row": lambda r: (r(1, 3), r(3, 4)),
    "a column": lambda r: (r(5, 1), r(1, 4)),
    "a column view of a wider array": lambda r: (r(5, 3)[:, 1:2], r(1, 4)),
    "a row of a transposed array": lambda r: (r(3, 5).T[2:3], r(3, 4)),
    "sliced rows (ld > cols)": lambda r: (r(5, 8)[:, :3], r(3, 4)),
    "batched": lambda r: (r(2, 3, 5, 4), r(2, 3, 4, 6)),
    "batched against one matrix": lambda r: (r(2, 3, 5, 4), r(4, 6)),
    "batched, swapped axes (attention's k.T)": lambda r: (r(2, 3, 5, 4), r(2, 3, 7, 4).swapaxes(-1, -2)),
    "heads in the projections' layout (B, S, H, D) viewed as (B, H, S, D)": lambda r: (
        r(2, 5, 3, 4).transpose(0, 2, 1, 3), r(2, 7, 3, 4).transpose(0, 2, 3, 1)),
    "a broadcast batch axis": lambda r: (r(2, 1, 5, 4), r(1, 3, 4, 6)),
    "an empty inner dimension": lambda r: (r(3, 0), r(0, 2)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_plan_computes_the_product_or_asks_for_a_copy(layout):
    a, b = LAYOUTS[layout](r)
    got = carried_out(a, b)
    if got is None:  # cuBLAS cannot read one of them in place: the copy in C order must plan
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = np.ascontiguousarray(np.broadcast_to(a, batch + a.shape[-2:]))
        b = np.ascontiguousarray(np.broadcast_to(b, batch + b.shape[-2:]))
        got = carried_out(a, b)
        assert got is not None, layout
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12, err_msg=layout)


def test_the_common_layouts_need_no_copy():
    for layout in ("C @ C", "C @ W.T (a linear layer)", "g.T @ x (its weight gradient)", "batched",
                   "batched against one matrix", "batched, swapped axes (attention's k.T)", "sliced rows (ld > cols)"):
        a, b = LAYOUTS[layout](r)
        assert carried_out(a, b) is not None, layout


def test_a_plan_refuses_what_cublas_cannot_read():
    x = r(4, 6)[:, ::2]  # every other column: no unit stride
    assert cublas.gemm_plan(x.shape, element_strides(x), (3, 2), (2, 1)) is None
    with pytest.raises(ValueError, match="shapes do not agree"):
        cublas.gemm_plan((2, 3), (3, 1), (4, 2), (2, 1))


def test_on_numpy_arrays_matmul_is_numpys_product():
    a, b = r(2, 5, 3), r(3, 4)
    np.testing.assert_array_equal(cublas.matmul(a, b), a @ b)
    out = np.empty((2, 5, 4))
    assert cublas.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, a @ b)
    with pytest.raises(ValueError, match="at least 2 axes"):
        cublas.matmul(r(3), b)
