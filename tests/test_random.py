"""tinyformer.random: seeded draws, and uniform_blocks giving exactly one draw's samples."""

import numpy as np
import pytest

from tinyformer import Tensor, backend, functional as F, random


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-threads")
def threads(request, monkeypatch, set_threads):
    monkeypatch.setattr(backend, "ROW_BLOCK_MIN_ELEMENTS", 64)  # split even small draws
    monkeypatch.setattr(random, "UNIFORM_BLOCK", 48)  # several blocks per thread
    set_threads(request.param)
    return request.param


@pytest.mark.parametrize("size", [0, 1, 5, 48, 97, 128, 1001])
@pytest.mark.parametrize("buffered_half", [False, True], ids=["even-start", "odd-start"])
def test_uniform_blocks_are_one_draw_and_leave_the_generator_where_it_would(threads, size, buffered_half):
    reference, generator = np.random.default_rng(7), np.random.default_rng(7)
    if buffered_half:  # an odd number of float32 samples drawn before: half a PCG64 step is buffered
        reference.random(1, dtype=np.float32), generator.random(1, dtype=np.float32)
    expected = reference.random(size, dtype=np.float32)
    got = np.full(size, -1.0, dtype=np.float32)
    seen = np.zeros(size, dtype=int)

    def take(start, stop, samples):
        got[start:stop] = samples
        seen[start:stop] += 1

    random.uniform_blocks(generator, size, take)
    np.testing.assert_array_equal(got, expected)
    assert (seen == 1).all()
    assert generator.bit_generator.state == reference.bit_generator.state
    np.testing.assert_array_equal(generator.random(3), reference.random(3))


def test_uniform_blocks_with_another_bit_generator_draw_in_one_thread(threads):
    reference, generator = (np.random.Generator(np.random.MT19937(3)) for _ in range(2))
    expected = reference.random(500, dtype=np.float32)
    got = np.empty(500, dtype=np.float32)
    random.uniform_blocks(generator, 500, lambda a, b, u: got.__setitem__(slice(a, b), u))
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(generator.random(5), reference.random(5))  # MT19937's state holds arrays


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_mask_is_the_generators_uniform_draw(threads, p):
    """The blockwise, threaded dropout keeps exactly the elements whose sample u >= p."""
    x = np.random.default_rng(0).standard_normal((3, 7, 50)).astype(np.float32)
    expected_keep = np.random.default_rng(11).random(x.shape, dtype=np.float32) >= p
    t = Tensor(x, requires_grad=True)
    y = F.dropout(t, p, generator=np.random.default_rng(11))
    scale = np.float32(1.0 / (1.0 - p))
    np.testing.assert_array_equal(y.data, x * expected_keep * scale)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    y.backward(Tensor(g))
    np.testing.assert_array_equal(t.grad, g * expected_keep * scale)
