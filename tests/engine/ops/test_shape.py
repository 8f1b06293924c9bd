import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, basic_indices, integer_array_indices

import tinyformer
from strategies import broadcastable_shapes, broadcasts_to, leaf, scalar, seeds, shapes, uniform

TARGET_SHAPES = {
    "flat": lambda s: (-1,),
    "reversed": lambda s: s[::-1],
    "padded": lambda s: (1,) + s + (1,),
    "minus-one-first": lambda s: (-1,) + s[1:],
    "minus-one-last": lambda s: s[:-1] + (-1,),
}
RESHAPE_CALLS = {
    "varargs": lambda x, shape: x.reshape(*shape),
    "tuple": lambda x, shape: x.reshape(shape),
    "function": lambda x, shape: tinyformer.reshape(x, list(shape)),
}


@pytest.mark.parametrize("call", RESHAPE_CALLS)
@pytest.mark.parametrize("target", TARGET_SHAPES)
@settings(max_examples=8, deadline=None)
@given(shape=shapes(min_dims=1), seed=seeds)
def test_reshape(target, call, shape, seed):
    a = uniform(numpy.random.default_rng(seed), shape)
    new_shape, reshape = TARGET_SHAPES[target](shape), RESHAPE_CALLS[call]
    x = leaf(a)
    numpy.testing.assert_array_equal(reshape(x, new_shape).numpy(), a.reshape(new_shape))
    tinyformer.gradcheck(lambda x: reshape(x, new_shape), [x])


TRANSPOSE_CALLS = {
    "varargs": lambda x, axes: x.transpose(*axes),
    "tuple": lambda x, axes: x.transpose(tuple(axes)),
    "negative": lambda x, axes: x.transpose(*[a - x.ndim for a in axes]),
    "function": lambda x, axes: tinyformer.transpose(x, *axes),
}


@pytest.mark.parametrize("call", TRANSPOSE_CALLS)
@settings(max_examples=12, deadline=None)
@given(data=st.data(), seed=seeds)
def test_transpose(call, data, seed):
    shape = data.draw(shapes())
    axes = data.draw(st.permutations(range(len(shape))))
    a = uniform(numpy.random.default_rng(seed), shape)
    x = leaf(a)
    transpose = TRANSPOSE_CALLS[call]
    numpy.testing.assert_array_equal(transpose(x, axes).numpy(), a.transpose(axes))
    tinyformer.gradcheck(lambda x: transpose(x, axes), [x])


@pytest.mark.parametrize(
    "fn", [lambda x: x.transpose(), lambda x: tinyformer.transpose(x), lambda x: x.T],
    ids=["method", "function", "T"],
)
@settings(max_examples=12, deadline=None)
@given(shape=shapes(), seed=seeds)
def test_transpose_without_axes_reverses_them(fn, shape, seed):
    a = uniform(numpy.random.default_rng(seed), shape)
    x = leaf(a)
    numpy.testing.assert_array_equal(fn(x).numpy(), a.T)
    tinyformer.gradcheck(fn, [x])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds)
def test_swapaxes(data, seed):
    shape = data.draw(shapes(min_dims=1))
    axis = st.integers(-len(shape), len(shape) - 1)
    axis1, axis2 = data.draw(axis), data.draw(axis)
    a = uniform(numpy.random.default_rng(seed), shape)
    x = leaf(a)
    numpy.testing.assert_array_equal(x.swapaxes(axis1, axis2).numpy(), numpy.swapaxes(a, axis1, axis2))
    tinyformer.gradcheck(lambda x: tinyformer.swapaxes(x, axis1, axis2), [x])


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=seeds)
def test_broadcast_to(data, seed):
    target = data.draw(shapes())
    a = uniform(numpy.random.default_rng(seed), data.draw(broadcasts_to(target)))
    x = leaf(a)
    numpy.testing.assert_array_equal(x.broadcast_to(target).numpy(), numpy.broadcast_to(a, target))
    tinyformer.gradcheck(lambda x: tinyformer.broadcast_to(x, target), [x])


def check_index(a, index):
    x = leaf(a)
    numpy.testing.assert_array_equal(x[index].numpy(), a[index])
    tinyformer.gradcheck(lambda x: x[index], [x])


@settings(max_examples=30, deadline=None)
@given(data=st.data(), seed=seeds)
def test_getitem_basic_index(data, seed):
    shape = data.draw(shapes(min_dims=1))
    index = data.draw(basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    check_index(uniform(numpy.random.default_rng(seed), shape), index)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=seeds)
def test_getitem_integer_arrays(data, seed):
    shape = data.draw(shapes(min_dims=1))
    index = data.draw(integer_array_indices(shape, result_shape=array_shapes(min_dims=1, max_dims=2, max_side=5)))
    check_index(uniform(numpy.random.default_rng(seed), shape), index)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds)
def test_getitem_boolean_mask(data, seed):
    shape = data.draw(shapes(min_dims=1))
    mask_dims = data.draw(st.integers(1, len(shape)))
    rng = numpy.random.default_rng(seed)
    check_index(uniform(rng, shape), rng.random(shape[:mask_dims]) < 0.5)


INDICES = {
    "slices": (slice(1, None), slice(None, 3), slice(None)),
    "negative-steps": (slice(None, None, -1), slice(3, 0, -2)),
    "ints": (1, -1),
    "none-ellipsis": (None, Ellipsis, 0, None),
    "repeated-ints": numpy.array([0, 2, 0, 0]),
    "repeated-list": [1, 1, -2],
    "repeated-pairs": (numpy.array([0, 0, 2]), slice(None), numpy.array([1, 1, 1])),
    "repeated-2d": (slice(None), numpy.array([[3, 3], [0, 3]])),
    "mask": numpy.array([True, False, True]),
    "mask-and-slice": (numpy.array([False, True, True]), slice(None, None, -1)),
    "int-tensor": tinyformer.Tensor(numpy.array([2, 2, 1])),
}


@pytest.mark.parametrize("index", INDICES.values(), ids=INDICES.keys())
def test_getitem_examples(index):
    a = uniform(numpy.random.default_rng(0), (3, 4, 2))
    x = leaf(a)
    raw = index.numpy() if isinstance(index, tinyformer.Tensor) else index
    numpy.testing.assert_array_equal(x[index].numpy(), a[raw])
    tinyformer.gradcheck(lambda x: x[index], [x])


@pytest.mark.parametrize(
    "index, counts",
    [
        (numpy.array([0, 0, 2, 0, 3]), [3, 0, 1, 1]),
        ([3, 3, -1], [0, 0, 0, 3]),
        (numpy.array([[1, 1], [1, 2]]), [0, 3, 1, 0]),
    ],
)
def test_repeated_indices_accumulate(index, counts):
    x = leaf(numpy.arange(4.0))
    x[index].backward(numpy.full(numpy.shape(index), 2.0))
    numpy.testing.assert_array_equal(x.grad, 2.0 * numpy.array(counts))


def test_boolean_tensor_mask():
    a = numpy.array([[-1.0, 2.0], [3.0, -4.0]])
    x = leaf(a)
    out = x[x > 0]
    numpy.testing.assert_array_equal(out.numpy(), [2.0, 3.0])
    out.backward(numpy.array([5.0, 7.0]))
    numpy.testing.assert_array_equal(x.grad, [[0.0, 5.0], [7.0, 0.0]])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds)
def test_concat(data, seed):
    shape = data.draw(shapes(min_dims=1, max_size=24))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    rng = numpy.random.default_rng(seed)
    arrays = [uniform(rng, shape[:axis % len(shape)] + (n,) + shape[axis % len(shape) + 1:]) for n in sizes]
    xs = [leaf(a) for a in arrays]
    numpy.testing.assert_array_equal(tinyformer.concat(xs, axis=axis).numpy(), numpy.concatenate(arrays, axis))
    tinyformer.gradcheck(lambda *xs: tinyformer.concat(xs, axis=axis), xs)


def test_concat_with_constants_and_repeats():
    a, b = numpy.arange(6.0).reshape(2, 3), numpy.ones((1, 3))
    x = leaf(a)
    out = tinyformer.concat([x, b, x], axis=0)
    numpy.testing.assert_array_equal(out.numpy(), numpy.concatenate([a, b, a]))
    tinyformer.gradcheck(lambda x: tinyformer.concat([x, b, x], axis=-2), [x])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=seeds)
def test_stack(data, seed):
    shape = data.draw(shapes(max_size=24))
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    count = data.draw(st.integers(1, 3))
    rng = numpy.random.default_rng(seed)
    arrays = [uniform(rng, shape) for _ in range(count)]
    xs = [leaf(a) for a in arrays]
    numpy.testing.assert_array_equal(tinyformer.stack(xs, axis=axis).numpy(), numpy.stack(arrays, axis))
    tinyformer.gradcheck(lambda *xs: tinyformer.stack(xs, axis=axis), xs)


@pytest.mark.parametrize("kind", ["tensors", "scalar-a", "scalar-b", "tensor-condition"])
@settings(max_examples=15, deadline=None)
@given(shape_list=broadcastable_shapes(num=3), seed=seeds)
def test_where(kind, shape_list, seed):
    rng = numpy.random.default_rng(seed)
    cond_shape, a_shape, b_shape = shape_list
    condition = rng.random(cond_shape) < 0.5
    a, b = uniform(rng, a_shape), uniform(rng, b_shape)
    if kind == "scalar-a":
        a = scalar(rng)
    if kind == "scalar-b":
        b = scalar(rng)
    inputs = [leaf(v) if isinstance(v, numpy.ndarray) else v for v in (a, b)]
    cond = tinyformer.Tensor(condition) if kind == "tensor-condition" else condition
    out = tinyformer.where(cond, *inputs)
    numpy.testing.assert_array_equal(out.numpy(), numpy.where(condition, a, b))
    tinyformer.gradcheck(lambda a, b: tinyformer.where(cond, a, b), inputs)


def test_where_needs_a_boolean_condition():
    with pytest.raises(TypeError, match="boolean"):
        tinyformer.where(numpy.array([1, 0]), leaf([1.0, 2.0]), 0.0)


@pytest.mark.parametrize("value", [-1e9, -1e4, 0.0, 2.5])
@settings(max_examples=15, deadline=None)
@given(data=st.data(), seed=seeds, as_tensor=st.booleans())
def test_masked_fill(value, data, seed, as_tensor):
    shape = data.draw(shapes())
    rng = numpy.random.default_rng(seed)
    a, mask = uniform(rng, shape), rng.random(data.draw(broadcasts_to(shape))) < 0.5
    x = leaf(a)
    m = tinyformer.Tensor(mask) if as_tensor else mask
    numpy.testing.assert_array_equal(x.masked_fill(m, value).numpy(), numpy.where(mask, value, a))
    tinyformer.gradcheck(lambda x: tinyformer.masked_fill(x, m, value), [x])


def test_masked_fill_errors():
    x = leaf(numpy.ones((2, 3)))
    with pytest.raises(ValueError, match=r"MaskedFill.*\(2, 2, 3\)"):
        x.masked_fill(numpy.ones((2, 2, 3), dtype=bool), 0.0)
    with pytest.raises(TypeError, match="boolean"):
        x.masked_fill(numpy.ones((2, 3)), 0.0)


@pytest.mark.parametrize(
    "fn, name, shapes_named",
    [
        (lambda x: x.reshape(4, 2), "Reshape", [(2, 3)]),
        (lambda x: x.broadcast_to((3, 2)), "BroadcastTo", [(2, 3)]),
        (lambda x: tinyformer.concat([x, leaf(numpy.ones((2, 4)))], axis=0), "Concat", [(2, 3), (2, 4)]),
        (lambda x: tinyformer.stack([x, leaf(numpy.ones((3, 2)))]), "Stack", [(2, 3), (3, 2)]),
        (lambda x: tinyformer.where(numpy.ones(4, dtype=bool), x, 0.0), "Where", [(2, 3)]),
    ],
    ids=["reshape", "broadcast_to", "concat", "stack", "where"],
)
def test_shape_mismatch_names_op_and_shapes(fn, name, shapes_named):
    with pytest.raises(ValueError) as error:
        fn(leaf(numpy.ones((2, 3))))
    assert name in str(error.value)
    assert all(str(s) in str(error.value) for s in shapes_named)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.transpose(0, 2),
        lambda x: x.transpose(0, 1, 2),
        lambda x: x.transpose(0, 0),
        lambda x: x.swapaxes(0, 2),
        lambda x: x.swapaxes(-3, 1),
        lambda x: tinyformer.concat([x, x], axis=2),
        lambda x: tinyformer.concat([x, x], axis=-3),
        lambda x: tinyformer.stack([x, x], axis=3),
        lambda x: tinyformer.stack([x, x], axis=-4),
    ],
    ids=["transpose-short", "transpose-long", "transpose-repeat", "swapaxes", "swapaxes-negative",
         "concat", "concat-negative", "stack", "stack-negative"],
)
def test_axis_out_of_range(fn):
    with pytest.raises(ValueError):
        fn(leaf(numpy.ones((2, 3))))


SHAPE_CALLS = {
    "reshape": lambda x, rng: x.reshape(-1),
    "transpose": lambda x, rng: x.T,
    "broadcast_to": lambda x, rng: x.broadcast_to((2, 3, 4)),
    "getitem": lambda x, rng: x[[0, 0], 1:],
    "concat": lambda x, rng: tinyformer.concat([x, x], axis=1),
    "stack": lambda x, rng: tinyformer.stack([x, x], axis=-1),
    "where-scalar-a": lambda x, rng: tinyformer.where(rng.random((3, 4)) < 0.5, 0.5, x),
    "where-scalar-b": lambda x, rng: tinyformer.where(rng.random(4) < 0.5, x, -1),
    "masked_fill": lambda x, rng: x.masked_fill(rng.random(4) < 0.5, -1e9),
}


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("name", SHAPE_CALLS)
def test_dtype_preserved(name, dtype):
    rng = numpy.random.default_rng(0)
    x = leaf(uniform(rng, (3, 4)), dtype=dtype)
    out = SHAPE_CALLS[name](x, rng)
    assert out.dtype == dtype
    raw = out.grad_fn.backward(numpy.ones(out.shape, dtype))
    assert all(g.dtype == dtype for g in (raw if isinstance(raw, tuple) else (raw,)) if g is not None)
    out.backward(numpy.ones(out.shape))
    assert x.grad.dtype == dtype


@settings(max_examples=10, deadline=None)
@given(shape=shapes(min_dims=2, max_dims=3), seed=seeds)
def test_pack_rows_and_unpack_rows_move_rows_and_their_gradients(shape, seed):
    """pack_rows takes the chosen rows of the last axis, unpack_rows puts them back with zeros
    elsewhere; each is the other's gradient (float64 central differences, random upstream)."""
    from tinyformer.engine.ops import pack_rows, unpack_rows

    rng = numpy.random.default_rng(seed)
    a = uniform(rng, shape)
    rows = a.reshape(-1, shape[-1])
    index = numpy.flatnonzero(rng.random(rows.shape[0]) < 0.6)
    packed = pack_rows(leaf(a), index)
    numpy.testing.assert_array_equal(packed.numpy(), rows[index])
    back = numpy.zeros_like(rows)
    back[index] = rows[index]
    numpy.testing.assert_array_equal(unpack_rows(leaf(rows[index]), index, shape).numpy(), back.reshape(shape))
    tinyformer.gradcheck(lambda x: pack_rows(x, index), [leaf(a)])
    tinyformer.gradcheck(lambda x: unpack_rows(x, index, shape), [leaf(rows[index])])


def test_unpack_rows_names_a_wrong_shape():
    from tinyformer.engine.ops import pack_rows, unpack_rows

    message = r"unpack_rows: x must be \(2, 3\) for 2 rows of shape \(2, 2, 3\), got \(3, 3\)"
    with pytest.raises(ValueError, match=message):
        unpack_rows(leaf(numpy.ones((3, 3))), numpy.array([0, 3]), (2, 2, 3))
    with pytest.raises(ValueError, match=r"pack_rows: x must have rows"):
        pack_rows(leaf(numpy.ones(3)), numpy.array([0]))
