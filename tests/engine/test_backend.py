"""Backend selection: numpy on the CPU, cupy only when a GPU is really usable."""

import sys

import devices
import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import backend



def test_numpy_arrays_select_numpy():
    assert backend.get_array_module(np.ones(2), np.zeros(3)) is np
    assert backend.get_array_module() is np
    assert backend.device_of(np.ones(2)) == "cpu"


def test_default_dtype_is_float32():
    assert backend.DEFAULT_DTYPE == np.float32


def test_to_device_cpu_keeps_numpy_arrays():
    a = np.arange(3.0)
    assert backend.to_device(a, "cpu") is a
    with pytest.raises(ValueError, match="device"):
        backend.to_device(a, "gpu")


class _FakeCupy:
    """Imports fine but has no usable device: availability must come from is_available()."""

    ndarray = type("ndarray", (), {})

    @staticmethod
    def is_available():
        return False


def test_gpu_availability_comes_from_cupy_is_available(monkeypatch):
    monkeypatch.setattr(backend.devices, "cupy", _FakeCupy)
    monkeypatch.setattr(backend.devices, "_gpu_available", None)
    assert backend.is_gpu_available() is False
    with pytest.raises(RuntimeError, match="GPU"):
        backend.check_device("cuda")


def test_captured_memory_is_the_memory_function_of_the_capture_in_progress():
    """``captured_memory`` hands the NumPy arrays among an op's outputs to the ``memory`` of the
    enclosing ``capturing(memory=...)``, and returns them as they are elsewhere."""
    a, handed = np.zeros(2), []
    assert backend.captured_memory(a) is a
    with backend.capturing(memory=lambda array: handed.append(array) or array[:1]):
        first, second = backend.captured_memory((a, None))
        assert first.shape == (1,) and second is None and handed == [a]
        assert backend.captured_memory(a).shape == (1,) and backend.captured_memory(None) is None
        with backend.capturing():  # a capture without a memory of its own (CuPy's): as they are
            assert backend.captured_memory(a) is a
        assert backend.captured_memory(a).shape == (1,)
    assert backend.captured_memory(a) is a and not backend.is_capturing()


def test_scatter_add_accumulates_repeated_indices():
    target = np.zeros(3)
    backend.scatter_add(target, np.array([0, 0, 2]), np.array([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(target, [3.0, 0.0, 5.0])


@devices.needs_gpu
def test_ops_on_the_gpu_match_numpy():
    import cupy

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 5))
    results = []
    for device in ("cpu", "cuda"):
        x = tf.Tensor(a, requires_grad=True).to(device).detach()
        x.requires_grad = True
        w = tf.Tensor(b).to(device)
        y = ((x @ w).tanh() * 2 + 1).max(axis=-1).sum()
        y.backward()
        assert isinstance(x.grad, cupy.ndarray if device == "cuda" else np.ndarray)
        results.append((float(y.item()), backend.to_numpy(x.grad)))
    assert np.isclose(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-10)


@devices.needs_gpu
def test_gradient_travels_back_across_devices():
    x = tf.Tensor(np.arange(3.0), requires_grad=True)
    (x.to("cuda") * 3).sum().backward()
    assert isinstance(x.grad, np.ndarray)
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])


@devices.needs_gpu
def test_numpy_masks_and_indices_follow_a_gpu_tensor():
    x = tf.Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True).to("cuda")
    mask = np.array([True, False, True])
    y = x.masked_fill(mask, 0.0) + tf.where(mask, x, 1.0) + x[np.array([1, 1])].sum(axis=0)
    y.sum().backward()
    assert y.device == "cuda"


def test_map_row_blocks_covers_every_row_once_in_order(monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    set_threads(3)
    blocks = backend.map_row_blocks(lambda a, b: (a, b), 10, np.zeros(1))
    set_threads(None)  # the default count below
    assert blocks == [(0, 3), (3, 6), (6, 10)]
    assert backend.map_row_blocks(lambda a, b: (a, b), 10, np.zeros(1)) in ([(0, 10)], blocks, [(0, 5), (5, 10)],
                                                                             [(0, 2), (2, 5), (5, 7), (7, 10)])


def test_cache_sized_pieces_cover_each_threads_rows_in_order(monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(backend.threads, "CACHE_BLOCK_ELEMENTS", 6)

    def pieces(rows, row_size=2):
        return backend.map_row_blocks(lambda a, b: (a, b), rows, np.zeros(1), row_size, cache_sized=True)

    set_threads(1)
    assert pieces(10) == [(0, 3), (3, 6), (6, 9), (9, 10)]  # 6 elements: 3 rows of 2
    assert pieces(3, row_size=50) == [(0, 1), (1, 2), (2, 3)]  # at least one row
    assert pieces(0) == [(0, 0)]
    set_threads(2)
    assert pieces(10) == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert backend.map_row_blocks(lambda a, b: (a, b), 10, np.zeros(1), 2) == [(0, 5), (5, 10)]  # not asked


@pytest.mark.parametrize("threads", [1, 2])
def test_work_in_cache_sized_pieces_is_bit_for_bit_the_one_piece_work(monkeypatch, set_threads, threads):
    """The callers of ``cache_sized=True`` (the loss's softmax and gradient, layer norm, the bias,
    ReLU and dropout passes, Adam) compute the same float32 values one row per piece as in one piece."""
    import tinyformer.engine.functional as F

    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    set_threads(threads)
    rng = np.random.default_rng(5)
    x, w1 = rng.standard_normal((2, 7, 12)).astype(np.float32), rng.standard_normal((16, 12)).astype(np.float32)
    b1, gamma, beta = (rng.standard_normal(n).astype(np.float32) for n in (16, 16, 16))
    w2, target = rng.standard_normal((11, 16)).astype(np.float32), rng.integers(0, 11, (2, 7))

    def run(piece):
        monkeypatch.setattr(backend.threads, "CACHE_BLOCK_ELEMENTS", piece)
        leaves = [tf.Tensor(a.copy(), requires_grad=True) for a in (x, w1, b1, gamma, beta, w2)]
        h = F.linear_relu_dropout(leaves[0], leaves[1], leaves[2], 0.3, generator=np.random.default_rng(1))
        h = F.dropout(F.layer_norm(h, leaves[3], leaves[4]), 0.2, generator=np.random.default_rng(2))
        loss, nll = F.cross_entropy(F.linear(h, leaves[5]), target, 0.1, ignore_index=0, return_nll=True)
        (loss + 0.5 * nll).backward()
        adam = tf.optim.Adam([tf.nn.Parameter(a.copy()) for a in (w1, w2)], lr=0.01)
        for parameter, leaf in zip(adam.params, (leaves[1], leaves[5])):
            parameter.grad = leaf.grad.copy()
        adam.step()
        return [loss.data, nll.data] + [leaf.grad for leaf in leaves] + [p.data for p in adam.params]

    for one_piece, row_pieces in zip(run(1 << 40), run(1)):
        np.testing.assert_array_equal(row_pieces, one_piece)


def test_set_num_threads_refuses_nonsense():
    with pytest.raises(ValueError, match="count must be a positive int"):
        backend.set_num_threads(0)


def test_blockwise_ufuncs_equal_the_plain_ones(monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 1)
    set_threads(3)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(backend.blockwise(np.add, a, b), a + b)
    assert backend.blockwise(np.add, a, b).dtype == np.float32
    np.testing.assert_array_equal(backend.blockwise(np.greater, a, 0), a > 0)
    np.testing.assert_array_equal(backend.blockwise(np.maximum, a, 0.5), np.maximum(a, 0.5))
    assert backend.blockwise(np.maximum, a, 0.5).dtype == np.float32  # Python scalars stay weak
    np.testing.assert_array_equal(backend.blockwise(np.add, a, b[0]), a + b[0])  # broadcast: plain call
    y = tf.Tensor(a, requires_grad=True)
    z = (y + tf.Tensor(b)).relu()
    z.backward(tf.Tensor(np.ones_like(a)))
    np.testing.assert_array_equal(z.data, np.maximum(a + b, 0))
    np.testing.assert_array_equal(y.grad, (a + b > 0).astype(np.float32))


# ------------------------------------------------------------------ bfloat16 through the bits
def _special_float32_bits():
    """Every kind of float32 the bit path must cast as ml_dtypes does: NaNs with every payload
    position and sign (CUDA's canonical 0x7FFFFFFF among them), ±inf, the largest finite values
    (some overflow to inf), exact ties (to even, both ways), subnormals, zeros, random values."""
    nan_payloads = [0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFF8000, 0x7FFFFFFF, 0x7F808000]
    nans = nan_payloads + [b | 0x80000000 for b in nan_payloads]
    infinities = [0x7F800000, 0xFF800000]
    largest = [0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F7F0000, 0xFF7FFFFF, 0xFF7F8000]
    ties = [0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x00008000, 0x00018000, 0x3F807FFF, 0x3F808001]
    subnormals = [0x00000001, 0x00007FFF, 0x00008001, 0x007FFFFF, 0x807FFFFF, 0x80000001]
    zeros = [0x00000000, 0x80000000]
    rng = np.random.default_rng(0)
    return np.concatenate([np.array(nans + infinities + largest + ties + subnormals + zeros, dtype=np.uint32),
                           rng.integers(0, 2**32, size=4096, dtype=np.uint32)])


def test_the_bfloat16_bit_path_casts_every_float32_as_ml_dtypes_does():
    """NaN stays NaN (sign kept, quiet 0x7FC0), ±inf and overflow, ties to even, subnormals: the bits
    of backend.to_bfloat16 equal ml_dtypes' cast, and from_bfloat16 is exact."""
    bits = _special_float32_bits()
    values = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = values.astype(backend.bfloat16)
    got = backend.to_bfloat16(values)
    assert got.dtype == backend.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
    nan = np.isnan(values)
    assert np.isnan(got.astype(np.float32)[nan]).all() and not np.isnan(got.astype(np.float32)[~nan]).any()
    np.testing.assert_array_equal(backend.from_bfloat16(got).view(np.uint32),
                                  expected.astype(np.float32).view(np.uint32))


@devices.needs_gpu
@pytest.mark.parametrize("native", [True, False], ids=["native-if-it-passes", "bit-path"])
def test_a_nan_activation_stays_nan_through_the_bfloat16_cast_on_the_gpu(monkeypatch, native):
    """backend.cast on CuPy (the native cast where it passes the probe, and the bit path) keeps
    NaN, the canonical CUDA NaN 0x7FFFFFFF included, and equals ml_dtypes' bits."""
    import cupy
    if not native:
        monkeypatch.setattr(backend.half_precision, "has_native_bfloat16_cast", lambda: False)
    bits = _special_float32_bits()
    with np.errstate(invalid="ignore", over="ignore"):
        expected = bits.view(np.float32).astype(backend.bfloat16).view(np.uint16)
    got = backend.cast(cupy.asarray(bits).view(np.float32), backend.bfloat16)
    np.testing.assert_array_equal(cupy.asnumpy(got.view(np.uint16)), expected)
    back = backend.cast(got, np.float32)
    assert bool(cupy.isnan(back[:14]).all())


def test_ml_dtypes_is_imported_only_when_bfloat16_is_asked_for():
    """Importing ml_dtypes takes over a second (it registers its dtypes with NumPy): a float32
    program, the command line included, never pays it; ``backend.bfloat16``, ``HALF_DTYPES`` and the
    bf16 precision bring it in, and the dtype predicates know bfloat16 from every other dtype."""
    import children
    script = """
import sys
import numpy
from tinyformer import amp, backend, cli
from tinyformer.translation import train
assert backend.is_floating(numpy.float32) and not backend.is_half(numpy.float32) and not backend.is_bfloat16("u2")
assert "ml_dtypes" not in sys.modules, "imported by a float32 program"
assert amp.PRECISIONS["bf16"].compute_dtype == backend.bfloat16 and "ml_dtypes" in sys.modules
assert backend.HALF_DTYPES == (numpy.dtype(numpy.float16), backend.bfloat16)
assert backend.is_bfloat16(backend.bfloat16) and backend.is_half(backend.bfloat16) and backend.is_floating(backend.bfloat16)
assert not backend.is_bfloat16(numpy.float16) and backend.is_half(numpy.float16) and not backend.is_bfloat16("V2")
print("ok")
"""
    result = children.run([children.PYTHON, "-c", script])
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
    with pytest.raises(AttributeError, match="no attribute 'bfloat17'"):
        backend.bfloat17


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_kept_memory_serves_the_next_large_array_without_page_faults():
    """A 64 MiB array freed and made again faults its pages in anew by default (glibc maps and
    unmaps it); after ``keep_freed_memory`` the second one reuses the first one's pages."""
    import children
    script = """
import resource, sys
import numpy
from numpy._core.multiarray import _set_madvise_hugepage
from tinyformer import backend
_set_madvise_hugepage(False)  # 4 KiB pages: one fault per page touched
if sys.argv[1] == "kept":
    assert backend.keep_freed_memory() and backend.keep_freed_memory()
numpy.ones(1 << 24, numpy.float32)  # made and freed
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
numpy.ones(1 << 24, numpy.float32)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = {}
    for mode in ("default", "kept"):
        result = children.run([children.PYTHON, "-c", script, mode])
        assert result.returncode == 0, result.stderr
        faults[mode] = int(result.stdout)
    assert faults["default"] > 8000 and faults["kept"] < 1000, faults  # 16,384 pages of 4 KiB
