"""Backend selection: numpy on the CPU, cupy only when a GPU is really usable."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import backend

gpu = pytest.mark.skipif(not backend.is_gpu_available(), reason="no usable CUDA GPU (cupy.is_available() is false)")


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
    monkeypatch.setattr(backend, "_cupy", _FakeCupy)
    monkeypatch.setattr(backend, "_gpu_available", None)
    assert backend.is_gpu_available() is False
    with pytest.raises(RuntimeError, match="GPU"):
        backend.check_device("cuda")


def test_scatter_add_accumulates_repeated_indices():
    target = np.zeros(3)
    backend.scatter_add(target, np.array([0, 0, 2]), np.array([1.0, 2.0, 5.0]))
    np.testing.assert_array_equal(target, [3.0, 0.0, 5.0])


@pytest.mark.gpu
@gpu
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


@pytest.mark.gpu
@gpu
def test_gradient_travels_back_across_devices():
    x = tf.Tensor(np.arange(3.0), requires_grad=True)
    (x.to("cuda") * 3).sum().backward()
    assert isinstance(x.grad, np.ndarray)
    np.testing.assert_array_equal(x.grad, [3.0, 3.0, 3.0])


@pytest.mark.gpu
@gpu
def test_numpy_masks_and_indices_follow_a_gpu_tensor():
    x = tf.Tensor(np.arange(6.0).reshape(2, 3), requires_grad=True).to("cuda")
    mask = np.array([True, False, True])
    y = x.masked_fill(mask, 0.0) + tf.where(mask, x, 1.0) + x[np.array([1, 1])].sum(axis=0)
    y.sum().backward()
    assert y.device == "cuda"


def test_map_row_blocks_covers_every_row_once_in_order(monkeypatch, set_threads):
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 1)
    set_threads(3)
    blocks = backend.map_row_blocks(lambda a, b: (a, b), 10, np.zeros(1))
    set_threads(None)  # the default count below
    assert blocks == [(0, 3), (3, 6), (6, 10)]
    assert backend.map_row_blocks(lambda a, b: (a, b), 10, np.zeros(1)) in ([(0, 10)], blocks, [(0, 5), (5, 10)],
                                                                             [(0, 2), (2, 5), (5, 7), (7, 10)])


def test_set_num_threads_refuses_nonsense():
    with pytest.raises(ValueError, match="count must be a positive int"):
        backend.set_num_threads(0)


def test_blockwise_ufuncs_equal_the_plain_ones(monkeypatch, set_threads):
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 1)
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
