"""Dropout seeds read from device memory (``kernels.arguments.DeviceSeed``), through the CPU emulation:
every kernel that draws Philox dropout gives, for a seed s read from a table, bit for bit what it
gives for ``seed=s``, and another value in the table changes its mask (the pointer is read); the
functional layer hands a DeviceSeed from ``random.kernel_seed`` through to forward and backward."""


import devices
import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import functional as F
from tinyformer.engine import random as tf_random
from tinyformer.testing.kernel_cases import rand
from tinyformer.engine.kernels import arguments, attention as attention_kernel, dropout as dropout_kernel
from tinyformer.engine.kernels import bias_relu_dropout as bias_relu_dropout_kernel
from tinyformer.engine.kernels import residual_layer_norm as residual_layer_norm_kernel

pytestmark = pytest.mark.usefixtures("cxx_compiler")  # skipped without g++ or clang++; failed in CI (compilers.py)

SEED, OTHER = 1234567, 98765


def device_seed(value, index=2):
    """``value`` as entry ``index`` of a table whose other entries are other seeds."""
    table = np.array([SEED + 1, OTHER + 1, SEED + 2, OTHER + 2], dtype=np.uint64)
    table[index] = value
    return arguments.DeviceSeed(table, index)


RNG = np.random.default_rng(0)
X, Y, G = rand(RNG, 5, 129), rand(RNG, 5, 129), rand(RNG, 5, 129)
W, B = rand(RNG, 129), rand(RNG, 129)
Q, K, V, DO = (rand(RNG, 2, 13, 32) for _ in range(4))  # (batch·heads, len, d) for attention.cu
Q16, K16, V16, DO16 = (rand(RNG, 1, 2, 17, 32).astype(np.float16) for _ in range(4))  # tensor cores


def attention(seed):
    o, lse = attention_kernel.attention_forward(Q, K, V, 2, causal=True, dropout_p=0.3, seed=seed)
    return (o, lse, *attention_kernel.attention_backward(Q, K, V, o, lse, DO, 2, causal=True, dropout_p=0.3, seed=seed))


def attention_mma(seed):
    o, lse = attention_kernel.attention_mma_forward(Q16, K16, V16, dropout_p=0.3, seed=seed)
    return (o, lse, *attention_kernel.attention_mma_backward(Q16, K16, V16, o, lse, DO16, dropout_p=0.3, seed=seed))


#: kernel -> (run(seed) -> its results, the index of the result that holds its mask or shows it)
KERNELS = {
    "dropout": (lambda seed: dropout_kernel.dropout_forward(X, 0.3, seed, offset=1), 1),
    "bias_relu_dropout": (lambda seed: bias_relu_dropout_kernel.bias_relu_dropout_forward(Y.copy(), B, 0.3, seed), 1),
    "residual_layer_norm": (lambda seed: residual_layer_norm_kernel.residual_layer_norm_forward(X, Y, W, B, 0.3, seed),
                            2),
    "attention": (attention, 0),
    "attention_mma": (attention_mma, 0),
}


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_seed_read_from_the_table_gives_the_kernel_of_that_seed(kernel):
    run, mask = KERNELS[kernel]
    by_value = run(SEED)
    from_table = run(device_seed(SEED))
    for a, b in zip(by_value, from_table):
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))  # bit for bit
    other = run(device_seed(OTHER))
    assert not np.array_equal(other[mask], by_value[mask])  # the kernel read the table, not the value 0


def test_the_table_entry_is_read_at_each_launch():
    """A refilled table gives the new seed's mask (what a replayed graph relies on)."""
    seed = device_seed(SEED)
    first = dropout_kernel.dropout_forward(X, 0.5, seed)[1]
    seed.table[seed.index] = OTHER
    assert np.array_equal(dropout_kernel.dropout_forward(X, 0.5, seed)[1],
                          dropout_kernel.dropout_forward(X, 0.5, OTHER)[1])
    assert not np.array_equal(first, dropout_kernel.dropout_forward(X, 0.5, seed)[1])


def test_device_seed_points_at_its_entry_and_refuses_bad_tables():
    table = np.arange(6, dtype=np.uint64)
    assert arguments.DeviceSeed(table, 4).pointer == table.ctypes.data + 4 * 8
    strided = table[::2]
    assert arguments.DeviceSeed(strided, 2).pointer == table.ctypes.data + 4 * 8
    with pytest.raises(TypeError, match="1-D uint64"):
        arguments.DeviceSeed(table.astype(np.int64), 0)
    with pytest.raises(TypeError, match="1-D uint64"):
        arguments.DeviceSeed(table.reshape(2, 3), 0)
    with pytest.raises(IndexError, match="index 6 outside a table of 6"):
        arguments.DeviceSeed(table, 6)
    assert arguments.seed_arguments(7, X) == (7, 0)
    assert arguments.seed_arguments(arguments.DeviceSeed(table, 1), X)[0] == 0


# ------------------------------------------------------------------------ through functional
def _drawn_seed(generator_seed):
    return tf_random.kernel_seed(np.random.default_rng(generator_seed))


def _run(fn, inputs, upstream):
    """fn's outputs and the inputs' gradients for an upstream gradient."""
    tensors = [Tensor(x.copy(), requires_grad=True) for x in inputs]
    out = fn(*tensors)
    out.backward(Tensor(upstream))
    return [out.data] + [t.grad for t in tensors]


FUNCTIONAL = {
    "dropout": (lambda gen: lambda x: F.dropout(x, 0.3, True, gen), [X], G),
    "linear_relu_dropout": (lambda gen: lambda x, w, b: F.linear_relu_dropout(x, w, b, 0.3, True, gen),
                            [X[:, :32], rand(RNG, 129, 32), B], G),
    "residual_dropout_layer_norm": (lambda gen: lambda x, y, w, b: F.residual_dropout_layer_norm(
        x, y, w, b, 0.3, True, gen), [X, Y, W, B], G),
    "attention": (lambda gen: lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.3,
                                                                            generator=gen),
                  [Q.reshape(1, 2, 13, 32), K.reshape(1, 2, 13, 32), V.reshape(1, 2, 13, 32)],
                  DO.reshape(1, 2, 13, 32)),
}


@pytest.mark.parametrize("op", FUNCTIONAL)
def test_functional_ops_hand_a_device_seed_to_forward_and_backward(op, emulated_kernels):
    """Under ``random.recording_kernel_seeds`` (a CUDA graph's capture) the op gets a DeviceSeed
    instead of a draw; with the drawn value in the table it computes what the eager op computes."""
    make, inputs, upstream = FUNCTIONAL[op]
    eager = _run(make(np.random.default_rng(5)), inputs, upstream)
    table, handed = np.zeros(3, dtype=np.uint64), []

    def recorder(generator):
        handed.append(arguments.DeviceSeed(table, 1))
        return handed[-1]

    table[1] = _drawn_seed(5)
    with tf_random.recording_kernel_seeds(recorder):
        from_table = _run(make(np.random.default_rng(5)), inputs, upstream)
    assert len(handed) == 1
    for a, b in zip(eager, from_table):
        assert np.array_equal(a, b)
    table[1] = OTHER
    with tf_random.recording_kernel_seeds(recorder):
        other = _run(make(np.random.default_rng(5)), inputs, upstream)
    assert not np.array_equal(other[0], eager[0])


@devices.needs_gpu
def test_a_device_seed_on_the_gpu_gives_the_mask_of_its_value():
    import cupy

    rng = np.random.default_rng(2)
    x = cupy.asarray(rand(rng, 1000, 33))
    table = cupy.asarray(np.array([5, 2 ** 62 + 9, 11], dtype=np.uint64))
    y, keep = dropout_kernel.dropout_forward(x, 0.3, arguments.DeviceSeed(table, 1))
    y_value, keep_value = dropout_kernel.dropout_forward(x, 0.3, 2 ** 62 + 9)
    assert bool((keep == keep_value).all()) and bool((y == y_value).all())
    q, k, v, g = (cupy.asarray(rand(rng, 2, 3, 70, 64).astype(np.float16)) for _ in range(4))
    by_value = attention_kernel.attention_mma_forward(q, k, v, dropout_p=0.2, seed=11)
    from_table = attention_kernel.attention_mma_forward(q, k, v, dropout_p=0.2, seed=arguments.DeviceSeed(table, 2))
    assert all(bool((a == b).all()) for a, b in zip(by_value, from_table))
    grads = [attention_kernel.attention_mma_backward(q, k, v, *by_value, g, dropout_p=0.2, seed=s)
             for s in (11, arguments.DeviceSeed(table, 2))]
    assert all(bool((a == b).all()) for a, b in zip(*grads))
    with pytest.raises(ValueError, match="must live on the device of the kernel's arrays"):
        dropout_kernel.dropout_forward(x, 0.3, arguments.DeviceSeed(np.zeros(2, np.uint64), 0))
