"""kernels/cublas.py's plans, checked on the CPU: each ``GemmPlan`` is carried out as cuBLAS reads
it (column-major matrices at the plan's leading dimensions and batch strides, over the operands'
own memory, NumPy's ``as_strided``) and compared with NumPy's product. On a GPU, the products of the same layouts
run through cuBLAS (below, and the graph tests)."""

import devices
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from tinyformer.engine import backend
from tinyformer.engine.kernels import cublas
from tinyformer.testing.kernel_cases import Device, rand


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


#: name -> the operands, made by r(*shape) (NumPy here; on the GPU, CuPy arrays)
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


# ------------------------------------------------------------------------ on the GPU only
CUBLAS_TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


@devices.needs_gpu
@pytest.mark.parametrize("dtype", list(CUBLAS_TOLERANCE))
def test_cublas_products_of_every_layout_match_numpy(dtype):
    """kernels.cublas.matmul on this file's layouts (whose plans the CPU checks above):
    the hardware's strided-batched GEMM against NumPy's product of the same rounded values."""
    import cupy

    rng = np.random.default_rng(5)
    dev = Device("cuda", dtype) if dtype != "float64" else None

    def r(*shape):  # an array on the GPU in dtype (float64: exact)
        values = rng.standard_normal(shape)
        return cupy.asarray(values) if dev is None else dev.put(values.astype(np.float32))

    def host(x):
        return (backend.to_numpy(x) if dev is None else dev.get(x)).astype(np.float64)

    for layout, make in LAYOUTS.items():
        a, b = make(r)  # the layout's views, of GPU memory
        got = host(cublas.matmul(a, b))
        expected = host(a) @ host(b)
        scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
        np.testing.assert_allclose(got, expected, rtol=0, atol=CUBLAS_TOLERANCE[dtype] * scale * 4, err_msg=layout)


@devices.needs_gpu
def test_cublas_products_are_captured_and_replayed_bit_for_bit():
    """A linear layer's three products (y = xWᵀ, dx = g W, dW = gᵀx) captured into a CUDA graph and
    replayed on new inputs: the eager products' bits (CuPy's own product cannot be captured)."""
    import cupy

    capture = backend.GraphCapture()
    rng = np.random.default_rng(0)
    x, w, g = (cupy.asarray(rand(rng, *shape)) for shape in ((512, 256), (1024, 256), (512, 1024)))
    outs = {}

    def products():
        outs["y"] = cublas.matmul(x, w.T)
        outs["dx"] = cublas.matmul(g, w)
        outs["dw"] = cublas.matmul(g.T, x)

    products()  # eagerly first, as a new shape's first step is: cuBLAS loads its kernels, the handle is made
    capture.begin()
    graph = capture.capture(products)
    capture.end()
    for _ in range(2):
        for a in (x, w, g):
            a[...] = cupy.asarray(rand(rng, *a.shape))
        capture.begin()
        capture.replay(graph)
        capture.end()
        eager = {"y": cublas.matmul(x, w.T), "dx": cublas.matmul(g, w), "dw": cublas.matmul(g.T, x)}
        for name, value in eager.items():
            assert bool((outs[name] == value).all()), name
        np.testing.assert_allclose(backend.to_numpy(outs["y"]), backend.to_numpy(x) @ backend.to_numpy(w).T,
                                   rtol=1e-4, atol=1e-4)
