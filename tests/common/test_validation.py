"""The one argument-check behaviour: NumPy integers are accepted, bools refused, everywhere."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import backend, functional as F
from tinyformer.translation import decode
from tinyformer.model import nn, optim
from tinyformer.translation.data.batching import ParallelData, batch_indices
from tinyformer.translation.data.synthetic import number_to_german
from tinyformer.common.validation import (
    rectangular_array,
    check_int,
    check_probability,
    check_real,
    is_integer,
    is_real,
)


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_integers_of_python_and_numpy_are_accepted(value):
    assert is_integer(value) and is_real(value)
    assert check_int("n", value, 1) == 3 and type(check_int("n", value, 1)) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 3.0, "3", None, np.float64(3)])
def test_bools_floats_and_strings_are_not_integers(value):
    assert not is_integer(value)
    with pytest.raises(ValueError, match=r"^n must be a positive integer, got "):
        check_int("n", value, 1)


def test_check_int_names_the_range_it_wanted():
    with pytest.raises(ValueError, match=r"^k must be an integer >= 0, got -1$"):
        check_int("k", -1, 0)
    with pytest.raises(ValueError, match=r"^k must be an integer in \[1, 9\], got 10$"):
        check_int("k", 10, 1, 9)
    assert check_int("k", np.int16(9), 1, 9) == 9


@pytest.mark.parametrize("value", [True, np.bool_(False), float("nan"), float("inf"), "0.5", None])
def test_check_real_refuses_bools_and_non_finite_values(value):
    assert check_real("x", 0.5) == 0.5
    with pytest.raises(ValueError, match=r"^x must be a finite number, got "):
        check_real("x", value)


def test_check_real_bounds_open_and_closed():
    assert check_real("x", np.float32(0.0), 0) == 0.0
    with pytest.raises(ValueError, match=r"^x must be a positive number, got 0$"):
        check_real("x", 0, 0, open_minimum=True)
    with pytest.raises(ValueError, match=r"^x must be a number >= 0, got -0.5$"):
        check_real("x", -0.5, 0)
    with pytest.raises(ValueError, match=r"^x must be a finite number, got inf$"):  # finite first, then bounds
        check_real("x", float("inf"), 0)
    with pytest.raises(ValueError, match=r"in \[0, 1\], got 1.5"):
        check_real("x", 1.5, 0, 1)


def test_check_probability_half_open_unless_told():
    assert check_probability("p", np.float64(0.25)) == 0.25
    assert check_probability("p", 1, allow_one=True) == 1.0
    for bad in (1.0, -0.1, True, float("nan")):
        with pytest.raises(ValueError, match=r"^p must be a probability in \[0, 1\), got "):
            check_probability("p", bad)


def test_as_array_names_a_ragged_argument():
    assert rectangular_array([[1, 2], [3, 4]], "ids").shape == (2, 2)
    with pytest.raises(ValueError, match=r"^ids must be a rectangular array, got a ragged list"):
        rectangular_array([[1, 2], [3]], "ids")


# The same behaviour where the library checks its arguments.
SITES = {
    "Linear": lambda n: nn.Linear(n, 4),
    "Embedding": lambda n: nn.Embedding(n, 4),
    "MultiHeadAttention": lambda n: nn.MultiHeadAttention(8, heads=n),
    "PositionwiseFeedForward": lambda n: nn.PositionwiseFeedForward(4, n),
    "PositionalEncoding": lambda n: nn.PositionalEncoding(4, max_len=n),
    "Transformer.num_layers": lambda n: nn.Transformer(src_vocab_size=11, d_model=8, d_ff=8, heads=2, num_layers=n),
    "sinusoid_table": lambda n: F.sinusoid_table(n, 4),
    "set_num_threads": lambda n: backend.set_num_threads(backend.set_num_threads(n)),
    "number_to_german": number_to_german,
    "ParallelData.max_len": lambda n: ParallelData([[5]], [[6]], max_len=n),
    "reshape": lambda n: tf.Tensor(np.zeros(2)).reshape(n),
    "NoamSchedule.d_model": lambda n: optim.NoamSchedule(n, 4),
    "NoamSchedule.warmup_steps": lambda n: optim.NoamSchedule(8, n),
    "batch_indices.max_tokens": lambda n: batch_indices([1, 1], [1, 1], max_tokens=n),
    "sum.axis": lambda n: tf.Tensor(np.zeros((2, 3, 4))).sum(axis=n),
}


@pytest.mark.parametrize("site", sorted(SITES))
def test_every_site_takes_numpy_integers_and_refuses_bools(site):
    SITES[site](np.int64(2))
    with pytest.raises((ValueError, TypeError), match="integer"):
        SITES[site](True)


def test_decoding_takes_numpy_integers_and_refuses_bools():
    model = nn.Transformer(src_vocab_size=11, d_model=8, d_ff=8, heads=2, num_layers=1, dropout=0.0)
    src = np.array([[4, 5, 6]])
    hyps = decode.beam_search(model, src, beam_size=np.int64(2), max_len=np.int32(4))
    assert len(hyps) == 1
    with pytest.raises(ValueError, match=r"beam_size must be a positive integer, got True"):
        decode.beam_search(model, src, beam_size=True)
    with pytest.raises(ValueError, match=r"max_len must be an integer >= 0, got False"):
        decode.greedy_decode(model, src, max_len=False)
