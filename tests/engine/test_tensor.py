"""The engine: Tensor construction, the backward pass, hooks, no_grad, graph freeing."""

import gc
import weakref

import numpy as np
import pytest

import tinyformer as tf
from tinyformer import Function, Tensor


def rand(*shape, dtype=np.float64, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ------------------------------------------------------------------- construction
def test_python_floats_default_to_float32_and_arrays_keep_their_dtype():
    assert Tensor([1.0, 2.0]).dtype == np.float32
    assert Tensor(3.5).dtype == np.float32
    assert Tensor(rand(2)).dtype == np.float64
    assert Tensor(rand(2, dtype=np.float32)).dtype == np.float32
    assert Tensor([1, 2]).dtype.kind == "i"
    assert Tensor([1.0], dtype=np.float64).dtype == np.float64


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(TypeError, match="floating"):
        Tensor([1, 2, 3], requires_grad=True)


def test_object_data_is_refused():
    with pytest.raises(TypeError, match="dtype"):
        Tensor(np.array([object()]))


def test_properties_and_conversions():
    data = rand(3, 4)
    t = Tensor(data, requires_grad=True)
    assert t.shape == (3, 4) and t.ndim == 2 and t.dtype == np.float64 and t.size == 12
    assert t.device == "cpu" and t.is_leaf and t.grad_fn is None
    assert t.numpy() is data
    assert len(t) == 3
    assert Tensor([[2.5]]).item() == 2.5
    with pytest.raises(ValueError, match="one element"):
        t.item()
    assert "requires_grad=True" in repr(t)


def test_detach_shares_data_and_leaves_the_graph():
    x = Tensor(rand(3), requires_grad=True)
    y = x * 2
    d = y.detach()
    assert d.data is y.data and not d.requires_grad and d.is_leaf


def test_to_device_validation():
    x = Tensor(rand(2))
    assert x.to("cpu") is x
    with pytest.raises(ValueError, match="device"):
        x.to("tpu")
    if not tf.backend.is_gpu_available():
        with pytest.raises(RuntimeError, match="GPU"):
            x.to("cuda")


# ------------------------------------------------------------------- backward basics
def test_acceptance_example_matmul_tanh():
    x = Tensor(rand(3, 4), requires_grad=True)
    ((x @ x.T).tanh() * 2).sum().backward()
    assert x.grad.shape == (3, 4) and x.grad.dtype == np.float64
    s = x.data @ x.data.T
    upstream = 2 * (1 - np.tanh(s) ** 2)
    np.testing.assert_allclose(x.grad, upstream @ x.data + upstream.T @ x.data, rtol=1e-12)


def test_scalar_backward_defaults_to_one_and_others_need_a_grad():
    x = Tensor(rand(3), requires_grad=True)
    (x * 3).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 3.0))
    with pytest.raises(RuntimeError, match="grad must be given"):
        (x * 3).backward()
    with pytest.raises(ValueError, match="shape"):
        (x * 3).backward(np.ones(4))


def test_explicit_upstream_gradient():
    x = Tensor(rand(2, 3), requires_grad=True)
    g = rand(2, 3, seed=1)
    (x * x).backward(g)
    np.testing.assert_allclose(x.grad, 2 * x.data * g)


def test_backward_from_a_tensor_without_grad_is_an_error():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(rand(2)).sum().backward()


def test_a_tensor_used_twice_accumulates_its_gradient():
    x = Tensor(rand(4), requires_grad=True)
    y = x * x + x  # x feeds three uses
    y.backward(np.ones(4))
    np.testing.assert_allclose(x.grad, 2 * x.data + 1)


def test_backward_twice_accumulates_into_grad_and_zero_grad_resets():
    x = Tensor(rand(3), requires_grad=True)
    (x * 2).sum().backward()
    (x * 5).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(3, 7.0))
    x.zero_grad()
    assert x.grad is None


def test_grad_does_not_alias_arrays_of_other_tensors():
    x = Tensor(rand(3), requires_grad=True)
    y = Tensor(rand(3), requires_grad=True)
    (x + y).backward(np.ones(3))  # Add hands the same array to both inputs
    x.grad *= 10
    np.testing.assert_array_equal(y.grad, np.ones(3))


def test_broadcast_inputs_receive_gradients_of_their_own_shape():
    a = Tensor(rand(3, 1), requires_grad=True)
    b = Tensor(rand(4), requires_grad=True)
    g = rand(3, 4, seed=2)
    (a * b).backward(g)
    assert a.grad.shape == (3, 1) and b.grad.shape == (4,)
    np.testing.assert_allclose(a.grad, (g * b.data).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(b.grad, (g * a.data).sum(axis=0))


def test_arrays_and_scalars_mix_on_either_side():
    x = Tensor(rand(3), requires_grad=True)
    for y in (np.ones(3) + x, x + np.ones(3), 2.0 * x, x * 2, 1 - x, 1 / (x * x + 1)):
        assert isinstance(y, Tensor) and y.requires_grad


def test_float32_stays_float32_with_python_scalars():
    x = Tensor(rand(3, dtype=np.float32), requires_grad=True)
    y = ((x * 0.5 + 1.5) / 3.0 - 0.25) ** 2
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


def test_mixed_precision_gradient_has_the_input_dtype():
    x = Tensor(rand(3, dtype=np.float32), requires_grad=True)
    w = Tensor(rand(3), requires_grad=True)
    y = x * w
    assert y.dtype == np.float64
    y.sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float64


def test_comparisons_are_not_differentiable():
    x = Tensor(rand(4), requires_grad=True)
    for mask in (x > 0, x >= 0, x < 0, x <= 0, x == 0, x != 0):
        assert mask.dtype == bool and not mask.requires_grad
    assert {x}  # tensors stay hashable despite __eq__


def test_a_long_chain_needs_no_recursion():
    # 20 times Python's default recursion limit (1,000), twice a limit raised to 10,000: a recursive
    # traversal fails here as surely as on a longer chain.
    n = 20_000
    x = Tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.00001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.00001**n], rtol=1e-9)


def test_independent_branches_and_unused_inputs():
    x = Tensor(rand(3), requires_grad=True)
    unused = Tensor(rand(3), requires_grad=True)
    _ = unused * 2
    (x.exp() + x.tanh()).sum().backward()
    assert unused.grad is None
    np.testing.assert_allclose(x.grad, np.exp(x.data) + 1 - np.tanh(x.data) ** 2)


# ------------------------------------------------------------------- graph freeing
def test_second_backward_through_a_freed_graph_is_a_clear_error():
    x = Tensor(rand(3), requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_a_second_backward():
    x = Tensor(rand(3), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad, 4 * x.data)


def test_backward_frees_saved_arrays():
    x = Tensor(rand(1000), requires_grad=True)
    hidden = x.exp()
    probe = weakref.ref(hidden.data)
    y = (hidden * 2).sum()
    del hidden
    gc.collect()
    assert probe() is not None  # saved for backward by the graph
    y.backward()
    gc.collect()
    assert probe() is None


def test_the_graph_keeps_no_values_that_no_op_saved():
    x = Tensor(rand(1000), requires_grad=True)
    hidden = x * 2
    probe = weakref.ref(hidden.data)
    y = hidden.reshape(10, 100).sum()  # reshape's and sum's backward need shapes, not values
    del hidden
    gc.collect()
    assert probe() is None  # the graph keeps the creator, shape and dtype of an intermediate input
    upstream = rand(1, seed=1).reshape(())
    y.backward(upstream)
    np.testing.assert_allclose(x.grad, np.full(1000, 2 * upstream))


def test_a_tensor_used_twice_is_one_edge_of_the_graph():
    x = Tensor(rand(4), requires_grad=True)
    h = x * 2
    y = h * h
    (first, second) = y.grad_fn.inputs
    assert first is second and not isinstance(first, Tensor)  # its Edge, not the tensor with its values
    assert first.grad_fn is h.grad_fn and first.shape == (4,)
    assert first.dtype == np.float64
    assert (x * 3).grad_fn.inputs[0] is x  # a leaf that requires grad is kept: its .grad is filled


# ------------------------------------------------------------------- retain_grad and hooks
def test_retain_grad_on_a_non_leaf():
    x = Tensor(rand(3), requires_grad=True)
    h = x * 2
    kept = x * 3
    kept.retain_grad()
    (h * kept).sum().backward()
    assert h.grad is None
    np.testing.assert_allclose(kept.grad, h.data)


def test_hook_on_a_non_leaf_sees_and_can_replace_the_gradient():
    x = Tensor(rand(3), requires_grad=True)
    h = x * 2
    seen = []
    h.register_hook(lambda g: seen.append(g.copy()))
    h.register_hook(lambda g: g * 10)
    upstream = rand(3, seed=3)
    h.backward(upstream)
    np.testing.assert_array_equal(seen[0], upstream)
    np.testing.assert_allclose(x.grad, 20 * upstream)


def test_hook_on_a_leaf_sees_the_total_gradient_and_can_be_removed():
    x = Tensor(rand(3), requires_grad=True)
    seen = []
    handle = x.register_hook(lambda g: seen.append(g.copy()))
    (x * 2 + x * 3).sum().backward()
    np.testing.assert_array_equal(seen[0], np.full(3, 5.0))
    handle.remove()
    (x * 2).sum().backward()
    assert len(seen) == 1


def test_a_hook_may_return_its_replacement_as_a_tensor():
    x = Tensor(rand(3), requires_grad=True)
    x.register_hook(lambda g: Tensor(g * 3))  # on the leaf
    h = x * 2
    h.register_hook(lambda g: Tensor(g + 1))  # on a non-leaf
    h.backward(np.ones(3))
    np.testing.assert_allclose(x.grad, np.full(3, 12.0))


def test_hooks_need_a_tensor_that_requires_grad():
    with pytest.raises(RuntimeError):
        Tensor(rand(2)).register_hook(lambda g: g)
    with pytest.raises(RuntimeError):
        Tensor(rand(2)).retain_grad()


# ------------------------------------------------------------------- no_grad
def test_no_grad_records_nothing():
    x = Tensor(rand(3), requires_grad=True)
    with tf.no_grad():
        y = x * 2
        assert not tf.is_grad_enabled()
        with tf.enable_grad():
            z = x * 2
    assert tf.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert z.requires_grad


def test_no_grad_as_a_decorator_and_after_an_exception():
    @tf.no_grad()
    def double(t):
        return t * 2

    @tf.no_grad
    def triple(t):
        return t * 3

    x = Tensor(rand(3), requires_grad=True)
    assert not double(x).requires_grad and not triple(x).requires_grad
    assert double.__name__ == "double"
    with pytest.raises(ZeroDivisionError):
        with tf.no_grad():
            1 / 0
    assert tf.is_grad_enabled() and (x * 2).requires_grad


# ------------------------------------------------------------------- tinyformer.grad
def test_grad_returns_gradients_without_touching_dot_grad():
    x = Tensor(rand(3), requires_grad=True)
    w = Tensor(rand(3), requires_grad=True)
    other = Tensor(rand(3), requires_grad=True)
    gx, gw, go = tf.grad((x * w).sum(), [x, w, other])
    np.testing.assert_allclose(gx, w.data)
    np.testing.assert_allclose(gw, x.data)
    np.testing.assert_array_equal(go, np.zeros(3))
    assert x.grad is None and w.grad is None


def test_grad_of_a_non_leaf():
    x = Tensor(rand(3), requires_grad=True)
    h = x * 2
    (gh,) = tf.grad((h * h).sum(), [h])
    np.testing.assert_allclose(gh, 2 * h.data)


# ------------------------------------------------------------------- custom Functions
class Cube(Function):
    """z = x³;  dz/dx = 3x²."""

    def forward(self, x):
        self.x = x
        return x**3

    def backward(self, g):
        return g * 3 * self.x**2


class SplitHalves(Function):
    """Two outputs: the first and the second half of a vector."""

    def forward(self, x):
        self.n = len(x)
        return x[: self.n // 2], x[self.n // 2 :]

    def backward(self, g_first, g_second):
        return np.concatenate([g_first, g_second])


class WrongShape(Function):
    def forward(self, x):
        return x * 1

    def backward(self, g):
        return g[:1]


def test_a_user_defined_function_plugs_into_the_engine():
    x = Tensor(rand(4), requires_grad=True)
    Cube.apply(x).sum().backward()
    np.testing.assert_allclose(x.grad, 3 * x.data**2)
    tf.gradcheck(Cube.apply, [Tensor(rand(4), requires_grad=True)])


def test_multi_output_function_with_an_unused_output():
    x = Tensor(rand(6), requires_grad=True)
    first, _second = SplitHalves.apply(x)
    (first * 2).sum().backward()
    np.testing.assert_array_equal(x.grad, [2, 2, 2, 0, 0, 0])


class SplitHalvesLazy(SplitHalves):
    materialize_grads = False
    received = None

    def backward(self, g_first, g_second):
        SplitHalvesLazy.received = (g_first is None, g_second is None)
        zeros = np.zeros(self.n // 2)
        return np.concatenate([zeros if g_first is None else g_first,
                               zeros if g_second is None else g_second])


def test_materialize_grads_false_passes_none_for_unused_outputs():
    x = Tensor(rand(6), requires_grad=True)
    _first, second = SplitHalvesLazy.apply(x)
    (second * 3).sum().backward()
    assert SplitHalvesLazy.received == (True, False)
    np.testing.assert_array_equal(x.grad, [0, 0, 0, 3, 3, 3])


def test_a_backward_returning_the_wrong_shape_is_named():
    x = Tensor(rand(4), requires_grad=True)
    with pytest.raises(RuntimeError, match="WrongShape"):
        WrongShape.apply(x).sum().backward()


def test_shape_errors_name_the_op_and_the_shapes():
    with pytest.raises(ValueError, match=r"Mul.*\(3, 4\).*\(5,\)"):
        Tensor(rand(3, 4)) * Tensor(rand(5))


# ------------------------------------------------------------------ post-accumulate hooks
def test_a_post_accumulate_hook_sees_the_whole_gradient_before_the_pass_ends():
    """The first layer's weight is finished only at the end, the last layer's early: each hook
    fires once, with ``.grad`` complete, as soon as the last Function feeding its leaf ran."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((3, 4)))
    w1, w2 = (Tensor(rng.standard_normal((4, 4)), requires_grad=True) for _ in range(2))
    events = []
    real_backward = {}

    def note(name):
        return lambda t: events.append((name, t.grad.copy()))

    w1.register_post_accumulate_grad_hook(note("w1"))
    handle = w2.register_post_accumulate_grad_hook(note("w2"))
    h = (x @ w1).tanh()
    y = (h @ w2) * (h @ w2)  # w2 used twice: complete after both uses
    tanh_node = h.grad_fn
    real_backward["tanh"] = tanh_node.backward
    tanh_node.backward = lambda g: (events.append(("tanh backward", None)), real_backward["tanh"](g))[1]
    upstream = rng.standard_normal((3, 4))
    y.backward(upstream)
    assert [name for name, _ in events] == ["w2", "tanh backward", "w1"]
    np.testing.assert_array_equal(events[0][1], w2.grad)
    np.testing.assert_array_equal(events[2][1], w1.grad)
    expected = tf.grad(((x @ w1).tanh() @ w2) * ((x @ w1).tanh() @ w2), [w1, w2], upstream)
    np.testing.assert_allclose(w1.grad, expected[0])
    np.testing.assert_allclose(w2.grad, expected[1])
    handle.remove()
    events.clear()
    (x @ w2).sum().backward()
    assert events == []  # removed; and tf.grad above called no hook


def test_post_accumulate_hooks_see_accumulated_gradients_and_need_a_leaf():
    w = Tensor(np.ones(3), requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.copy()))
    (w * 2).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_array_equal(seen[0], [2, 2, 2])
    np.testing.assert_array_equal(seen[1], [5, 5, 5])  # after adding into .grad
    with pytest.raises(RuntimeError, match="needs a leaf tensor that requires grad"):
        (w * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(RuntimeError, match="needs a leaf tensor that requires grad"):
        Tensor(np.ones(2)).register_post_accumulate_grad_hook(print)
