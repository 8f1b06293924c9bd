"""Module, Parameter and ModuleList: naming, tying, modes, state dicts, dtypes and devices."""

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.engine import backend
from tinyformer.model import nn, optim


class Block(nn.Module):
    """Own parameters set around a sub-module: a, inner (Linear 3 -> 4), b."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(np.zeros((2, 3), dtype=np.float32))
        self.inner = nn.Linear(3, 4)
        self.b = nn.Parameter(np.ones(5, dtype=np.float32))


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.scale = nn.Parameter(np.full(1, 2.0, dtype=np.float32))
        self.blocks = nn.ModuleList([nn.Linear(2, 2, bias=False), Block()])
        self.norm = nn.LayerNorm(4)


class Tied(nn.Module):
    """The same Linear under two names and one of its weights reused by a third module."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(3, 3)
        self.alias = self.encoder
        self.decoder = nn.Linear(3, 3)
        self.decoder.weight = self.encoder.weight


def tiny_model(**overrides):
    config = dict(vocab_size=11, d_model=8, d_ff=16, heads=2, num_layers=1, dropout=0.0)
    config.update(overrides)
    return nn.Transformer.from_preset("tiny", **config)


def snapshot(model):
    return {name: p.data.copy() for name, p in model.named_parameters()}


def assert_params_equal(model, snap):
    current = dict(model.named_parameters())
    assert list(current) == list(snap)
    for name, value in snap.items():
        np.testing.assert_array_equal(current[name].data, value, err_msg=name)


# ---------------------------------------------------------------------------- naming
def test_named_parameters_dotted_names_in_order():
    # Like PyTorch: a module's own parameters (in the order set), then its sub-modules' in order.
    names = [name for name, _ in Outer().named_parameters()]
    assert names == [
        "scale",
        "first.a", "first.b", "first.inner.weight", "first.inner.bias",
        "blocks.0.weight",
        "blocks.1.a", "blocks.1.b", "blocks.1.inner.weight", "blocks.1.inner.bias",
        "norm.weight", "norm.bias",
    ]


def test_named_parameters_name_the_objects_they_are():
    model = Outer()
    named = dict(model.named_parameters())
    assert named["first.inner.weight"] is model.first.inner.weight
    assert named["blocks.1.b"] is model.blocks[1].b
    assert named["norm.bias"] is model.norm.bias
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in named.values())


def test_parameters_are_the_named_parameters_same_objects():
    model = Outer()
    params = model.parameters()
    named = [p for _, p in model.named_parameters()]
    assert len(params) == len(named)
    assert all(p is q for p, q in zip(params, named))
    assert params[0] is model.scale


def test_transformer_parameter_names():
    model = tiny_model()
    names = [name for name, _ in model.named_parameters()]
    assert names[0] == "src_embed.weight"
    assert "tgt_embed.weight" not in names  # tied to src_embed.weight
    assert "encoder.layers.0.self_attn.w_q.weight" in names
    assert "decoder.layers.0.cross_attn.w_o.bias" in names
    assert "decoder.layers.0.ff_block.norm.weight" in names
    assert names.index("encoder.layers.0.self_attn.w_q.weight") < names.index("decoder.layers.0.self_attn.w_q.weight")
    assert len(set(names)) == len(names)


def test_tied_weights_listed_once_under_first_name():
    model = Tied()
    named = model.named_parameters()
    names = [n for n, _ in named]
    assert names == ["encoder.weight", "encoder.bias", "decoder.bias"]
    assert dict(named)["encoder.weight"] is model.decoder.weight
    assert model.num_parameters() == 9 + 3 + 3
    assert list(model.state_dict()) == names


def test_num_parameters_counts_scalars():
    assert nn.Linear(3, 4).num_parameters() == 3 * 4 + 4
    assert nn.Linear(3, 4, bias=False).num_parameters() == 12
    assert Block().num_parameters() == 6 + 5 + 12 + 4
    assert Outer().num_parameters() == 1 + 27 + 4 + 27 + 8
    assert Outer().num_parameters() == sum(p.size for p in Outer().parameters())


def test_zero_grad_clears_every_gradient():
    model = Block()
    for p in model.parameters():
        p.grad = np.ones_like(p.data)
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


# ---------------------------------------------------------------------------- modes
def test_train_and_eval_reach_every_submodule():
    model = tiny_model(dropout=0.1)
    modules = model.modules()
    assert len(modules) > 20
    assert all(m.training for m in modules)
    assert model.eval() is model
    assert not any(m.training for m in modules)
    assert model.train() is model
    assert all(m.training for m in modules)
    model.train(False)
    assert not any(m.training for m in modules)
    # the module lists' children too
    assert not model.decoder.layers[0].self_block.dropout.training


# ---------------------------------------------------------------------------- state dicts
def test_state_dict_holds_numpy_copies():
    model = Outer()
    state = model.state_dict()
    assert list(state) == [n for n, _ in model.named_parameters()]
    before = snapshot(model)
    for name, p in model.named_parameters():
        value = state[name]
        assert type(value) is np.ndarray
        assert value.shape == p.shape and value.dtype == p.dtype
        np.testing.assert_array_equal(value, p.data)
        assert not np.shares_memory(value, p.data)
        value += 1.0
    assert_params_equal(model, before)


def test_load_state_dict_round_trip_makes_models_equal():
    src = np.array([[3, 4, 5, 0], [2, 6, 1, 7]])
    tgt = np.array([[1, 3, 4], [1, 8, 9]])
    a, b = tiny_model(seed=1).eval(), tiny_model(seed=2).eval()
    assert not np.allclose(a(src, tgt).data, b(src, tgt).data)
    state = a.state_dict()
    assert b.load_state_dict(state) is b
    np.testing.assert_array_equal(b(src, tgt).data, a(src, tgt).data)
    # b holds copies: changing the dict afterwards does not reach b
    for value in state.values():
        value *= 0.0
    np.testing.assert_array_equal(b(src, tgt).data, a(src, tgt).data)


def test_load_state_dict_keeps_dtype_and_drops_grads():
    a, b = Block(), Block()
    for p in a.parameters():
        p.data = np.random.default_rng(0).standard_normal(p.shape).astype(np.float32)
    for p in b.parameters():
        p.grad = np.ones_like(p.data)
    state = {k: v.astype(np.float64) for k, v in a.state_dict().items()}
    b.load_state_dict(state)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert q.dtype == np.float32, name
        assert q.grad is None
        np.testing.assert_array_equal(q.data, p.data)


def donor_state():
    """A full, valid state of Block with values unlike a fresh Block's."""
    donor = Block()
    for i, p in enumerate(donor.parameters()):
        p.data = np.full(p.shape, 7.0 + i, dtype=np.float32)
    return donor.state_dict()


@pytest.mark.parametrize("strict", [True, False])
def test_mis_shaped_key_raises_naming_key_and_shapes(strict):
    model = Block()
    before = snapshot(model)
    state = donor_state()
    state["inner.weight"] = np.zeros((3, 4), dtype=np.float32)
    with pytest.raises(nn.StateDictError) as error:
        model.load_state_dict(state, strict=strict)
    assert isinstance(error.value, KeyError)
    message = str(error.value)
    assert "inner.weight" in message and "(3, 4)" in message and "(4, 3)" in message
    assert "first" not in message and "inner.bias" not in message
    assert_params_equal(model, before)  # nothing loaded, not even the good keys


def test_missing_key_raises_naming_it_and_changes_nothing():
    model = Block()
    before = snapshot(model)
    state = donor_state()
    del state["b"]
    with pytest.raises(nn.StateDictError) as error:
        model.load_state_dict(state)
    message = str(error.value)
    assert "missing" in message and "b" in message.split("missing")[1]
    assert "inner" not in message
    assert_params_equal(model, before)


def test_unexpected_key_raises_naming_it_and_changes_nothing():
    model = Block()
    before = snapshot(model)
    state = donor_state()
    state["extra.weight"] = np.zeros(2, dtype=np.float32)
    with pytest.raises(KeyError) as error:
        model.load_state_dict(state)
    assert isinstance(error.value, nn.StateDictError)
    message = str(error.value)
    assert "unexpected" in message and "extra.weight" in message
    assert_params_equal(model, before)


def test_every_problem_is_listed_at_once():
    model = Block()
    before = snapshot(model)
    state = donor_state()
    del state["a"]
    state["ghost"] = np.zeros(1)
    state["b"] = np.zeros(6, dtype=np.float32)
    with pytest.raises(nn.StateDictError) as error:
        model.load_state_dict(state)
    message = str(error.value)
    for part in ("missing", "unexpected", "ghost", "b", "(6,)", "(5,)"):
        assert part in message, part
    assert_params_equal(model, before)


def test_non_strict_tolerates_missing_and_unexpected_keys():
    model = Block()
    before = snapshot(model)
    state = donor_state()
    del state["a"], state["inner.bias"]
    state["ghost"] = np.zeros(3)
    model.load_state_dict(state, strict=False)
    np.testing.assert_array_equal(model.a.data, before["a"])
    np.testing.assert_array_equal(model.inner.bias.data, before["inner.bias"])
    np.testing.assert_array_equal(model.b.data, state["b"])
    np.testing.assert_array_equal(model.inner.weight.data, state["inner.weight"])


# ---------------------------------------------------------------------------- dtypes and devices
def test_to_float64_casts_parameters_and_buffers_in_place():
    model = tiny_model()
    params = model.parameters()
    values = [p.data.copy() for p in params]
    for p in params:
        p.grad = np.ones_like(p.data)
    assert model.positional.table.dtype == np.float32
    assert model.to(dtype=np.float64) is model
    assert model.positional.table.dtype == np.float64
    assert model.positional._buffers["table"] is model.positional.table
    new_params = model.parameters()
    assert len(new_params) == len(params)
    for p, q, v in zip(params, new_params, values):
        assert p is q
        assert p.dtype == np.float64
        assert p.grad is None
        np.testing.assert_array_equal(p.data, v.astype(np.float64))


def test_double_casts_and_keeps_optimizer_parameters():
    model = tiny_model()
    opt = optim.Adam(model.parameters(), lr=1e-3)
    assert model.double() is model
    assert all(a is b for a, b in zip(opt.params, model.parameters()))
    assert all(p.dtype == np.float64 for p in model.parameters())
    logits = model(np.array([[3, 4]]), np.array([[1, 5, 6]]))
    assert logits.dtype == np.float64
    assert model.to(dtype=np.float32).parameters()[0].dtype == np.float32
    assert model.positional.table.dtype == np.float32


def test_to_cpu_keeps_everything():
    model = Block()
    before = snapshot(model)
    params = model.parameters()
    assert model.to("cpu") is model
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(p.device == "cpu" and p.dtype == np.float32 for p in params)
    assert_params_equal(model, before)


def test_to_cuda_without_gpu_raises():
    if backend.is_gpu_available():
        pytest.skip("a GPU is available: moving to cuda is legal here")
    model = Block()
    before = snapshot(model)
    with pytest.raises(RuntimeError, match="cuda"):
        model.to("cuda")
    assert_params_equal(model, before)
    assert all(p.device == "cpu" for p in model.parameters())


def test_to_rejects_bad_device_and_dtype():
    model = Block()
    with pytest.raises(ValueError, match="device"):
        model.to("tpu")
    with pytest.raises(TypeError, match="floating"):
        model.to(dtype=np.int32)
    assert all(p.dtype == np.float32 for p in model.parameters())


# ---------------------------------------------------------------------------- ModuleList
def test_module_list_indexing_len_iter_append():
    layers = [nn.Linear(2, 2), nn.LayerNorm(2), nn.Linear(2, 3)]
    ml = nn.ModuleList(layers)
    assert len(ml) == 3
    assert ml[0] is layers[0] and ml[-1] is layers[2] and ml[1] is layers[1]
    assert list(ml) == layers
    assert [m for m in ml] == layers
    extra = nn.Dropout(0.2)
    assert ml.append(extra) is ml
    assert len(ml) == 4 and ml[3] is extra
    with pytest.raises(IndexError):
        ml[4]
    names = [n for n, _ in ml.named_parameters()]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight", "2.bias"]
    assert nn.ModuleList().num_parameters() == 0 and len(nn.ModuleList()) == 0


def test_module_list_children_follow_mode_and_dtype():
    ml = nn.ModuleList([nn.Dropout(0.5), nn.PositionalEncoding(4, max_len=6)])
    ml.eval()
    assert not ml[0].training and not ml[1].training
    ml.double()
    assert ml[1].table.dtype == np.float64


# ---------------------------------------------------------------------------- inference
def test_inference_is_eval_mode_without_a_graph_and_restores_every_modules_mode():
    model = tiny_model()
    model.train()
    model.decoder.eval()  # a mixed model: each module must get its own mode back
    before = [(m, m.training) for m in model.modules()]
    with nn.inference(model) as same:
        assert same is model
        assert not any(m.training for m in model.modules())
        assert not tf.is_grad_enabled()
        logits = model(np.array([[4, 5, 6]]), np.array([[1, 7]]))
        assert not logits.requires_grad
    assert tf.is_grad_enabled()
    assert all(m.training == mode for m, mode in before)


def test_inference_restores_modes_and_grad_recording_after_an_exception():
    model = tiny_model()
    model.encoder.layers[0].eval()
    before = [(m, m.training) for m in model.modules()]
    with pytest.raises(RuntimeError, match="inside"):
        with nn.inference(model):
            raise RuntimeError("inside")
    assert tf.is_grad_enabled()
    assert all(m.training == mode for m, mode in before)
    with tf.no_grad():  # nested in a no_grad block, leaving it keeps recording off
        with nn.inference(model):
            pass
        assert not tf.is_grad_enabled()
