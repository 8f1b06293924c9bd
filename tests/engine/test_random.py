"""tinyformer.engine.random: seeded draws, and fill_keep_mask giving one draw's mask whatever the threads."""

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import backend, functional as F, random


@pytest.fixture(params=[1, 2, 3], ids=lambda n: f"{n}-threads")
def threads(request, monkeypatch, set_threads):
    monkeypatch.setattr(backend.threads, "ROW_BLOCK_MIN_ELEMENTS", 64)  # split even small draws
    monkeypatch.setattr(random, "KEEP_BLOCK", 48)  # several blocks per thread
    set_threads(request.param)
    return request.param


def reference_keep(generator, size, p):
    """The mask as the docstring defines it: 16-bit words of ⌈size / 4⌉ raw outputs, low bits first."""
    raw = generator.bit_generator.random_raw(-(-size // 4))
    samples = np.stack([(raw >> np.uint64(16 * j)) & np.uint64(0xFFFF) for j in range(4)], axis=1).reshape(-1)
    return samples[:size] >= round(p * 65536)


@pytest.mark.parametrize("size", [0, 1, 5, 48, 97, 128, 1001])
@pytest.mark.parametrize("buffered_half", [False, True], ids=["even-start", "odd-start"])
def test_fill_keep_mask_is_one_draw_and_leaves_the_generator_where_it_would(threads, size, buffered_half):
    reference, generator = np.random.default_rng(7), np.random.default_rng(7)
    if buffered_half:  # a float32 sample drawn before: half a PCG64 output is buffered, and stays so
        reference.random(1, dtype=np.float32), generator.random(1, dtype=np.float32)
    expected = reference_keep(reference, size, 0.3)
    keep = np.zeros(size, dtype=bool)
    seen = np.zeros(size, dtype=int)

    def block(start, stop):
        assert (keep[start:stop] == expected[start:stop]).all()  # the block is made when fn sees it
        seen[start:stop] += 1

    random.fill_keep_mask(generator, 0.3, keep, block)
    np.testing.assert_array_equal(keep, expected)
    assert (seen == 1).all()
    assert generator.bit_generator.state == reference.bit_generator.state
    np.testing.assert_array_equal(generator.random(3, dtype=np.float32), reference.random(3, dtype=np.float32))


def test_fill_keep_mask_with_another_bit_generator_draws_in_one_thread(threads):
    reference, generator = (np.random.Generator(np.random.MT19937(3)) for _ in range(2))
    expected = reference_keep(reference, 500, 0.1)
    keep = np.empty(500, dtype=bool)
    random.fill_keep_mask(generator, 0.1, keep)
    np.testing.assert_array_equal(keep, expected)
    np.testing.assert_array_equal(generator.random(5), reference.random(5))  # MT19937's state holds arrays


@pytest.mark.parametrize("p, threshold", [(0.0, 0), (0.1, 6554), (0.5, 32768), (0.3, 19661), (0.99999, 65535)])
def test_drop_threshold_is_p_in_steps_of_two_to_the_minus_16(p, threshold):
    assert random.drop_threshold(p) == threshold


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_mask_drops_a_fraction_p(p):
    keep = np.empty(1 << 20, dtype=bool)
    random.fill_keep_mask(np.random.default_rng(5), p, keep)
    drop = 1.0 - keep.mean()
    assert abs(drop - p) < 5 * np.sqrt(p * (1 - p) / keep.size)  # five standard errors


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_cpu_dropout_mask_is_the_generators_draw(threads, p):
    """The blockwise, threaded dropout keeps exactly the elements of the one draw's mask."""
    x = np.random.default_rng(0).standard_normal((3, 7, 50)).astype(np.float32)
    expected_keep = reference_keep(np.random.default_rng(11), x.size, p).reshape(x.shape)
    t = Tensor(x, requires_grad=True)
    y = F.dropout(t, p, generator=np.random.default_rng(11))
    scale = np.float32(1.0 / (1.0 - p))
    np.testing.assert_array_equal(y.data, x * expected_keep * scale)
    g = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    y.backward(Tensor(g))
    np.testing.assert_array_equal(t.grad, g * expected_keep * scale)
