"""The probe API (nn.probe): every attention call of a model goes through its ``attention`` and
records into its ``probe``; the study layer (tests/study/test_course.py) swaps through the same door."""

import inspect

import numpy as np
import pytest

import tinyformer as tf
from tinyformer.model import nn
from tinyformer.model.nn.probe import Attention, AttentionProbe, attention_swapped


class Counting(Attention):
    """tinyformer's own attention, counting the heads' calls and the whole-module offers (declined)."""

    def __init__(self):
        self.heads_calls, self.module_offers = 0, []

    def heads(self, q, k, v, mask=None, causal=False, dropout_p=0.0, return_weights=False, generator=None):
        self.heads_calls += 1
        return super().heads(q, k, v, mask=mask, causal=causal, dropout_p=dropout_p, return_weights=return_weights,
                             generator=generator)

    def module(self, mha, call):
        assert call.query.ndim == 3 and call.key.shape[-1] == call.value.shape[-1] == mha.d_model  # padded layout
        self.module_offers.append(call)


def _model():
    return nn.Transformer.from_preset("tiny", vocab_size=23, pad_id=0, max_len=32, seed=3).eval()


SRC, TGT_IN = np.array([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]]), np.array([[1, 11, 12, 13], [1, 14, 15, 0]])


@pytest.mark.parametrize("packed", [False, True])
def test_every_attention_call_of_a_model_goes_through_its_attention_and_the_swap_is_undone(packed):
    model = _model()
    attentions = [m for m in model.modules() if isinstance(m, nn.MultiHeadAttention)]
    own = [m.attention for m in attentions]
    counted = TGT_IN != 0
    run = (lambda: model(SRC, TGT_IN, positions=counted, packed=True)) if packed else (lambda: model(SRC, TGT_IN))
    expected = run()
    expected.sum().backward()
    expected_grads = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    counting = Counting()
    with attention_swapped(model, counting) as swapped:
        assert swapped == attentions
        out = run()
        out.sum().backward()
    assert counting.heads_calls == len(attentions) == 6  # 2 encoder self, 2 decoder self, 2 cross
    assert len(counting.module_offers) == len(attentions)
    assert all(m.attention is a for m, a in zip(attentions, own))
    np.testing.assert_array_equal(out.data, expected.data)
    for grad, want in zip((p.grad for p in model.parameters()), expected_grads):
        np.testing.assert_array_equal(grad, want)
    with pytest.raises(KeyboardInterrupt):
        with attention_swapped(model, counting):
            raise KeyboardInterrupt
    assert all(m.attention is a for m, a in zip(attentions, own))


def test_a_call_with_a_cache_or_that_keeps_p_is_never_offered_to_a_module_replacement():
    rng = np.random.default_rng(0)
    mha = nn.MultiHeadAttention(8, 2).double().eval()
    counting = Counting()
    mha.attention = counting
    x = tf.Tensor(rng.standard_normal((1, 3, 8)))
    mha(x, cache={})
    mha(x, need_weights=True)
    mha.keep_attention = True
    mha(x)
    assert counting.heads_calls == 3 and counting.module_offers == []
    mha.keep_attention = False
    mha(x)
    assert counting.heads_calls == 4 and len(counting.module_offers) == 1


def test_the_probe_keeps_p_the_heads_inputs_and_output_and_its_offset_moves_o():
    rng = np.random.default_rng(1)
    mha = nn.MultiHeadAttention(8, 2, keep_attention=True).double()
    x = tf.Tensor(rng.standard_normal((2, 3, 8)), requires_grad=True)
    out = mha(x, causal=True)
    probe = mha.probe
    assert isinstance(probe, AttentionProbe) and mha.attention_probs is probe.probs
    q, k, v = probe.inputs
    assert probe.probs.requires_grad and probe.heads_output.requires_grad
    np.testing.assert_allclose(probe.heads_output.data, probe.probs.data @ v.data, rtol=1e-13)
    merged = probe.heads_output.data.transpose(0, 2, 1, 3).reshape(2, 3, 8)
    np.testing.assert_allclose(out.data, merged @ mha.w_o.weight.data.T + mha.w_o.bias.data, rtol=1e-12)
    probe.heads_output.retain_grad()
    out.sum().backward()
    assert probe.heads_output.grad.shape == (2, 2, 3, 4)
    offset = np.zeros((2, 2, 3, 4))
    offset[1, 0, 2] = 0.5
    probe.offset = offset
    moved = mha(x, causal=True).data
    np.testing.assert_allclose(moved - out.data, offset.transpose(0, 2, 1, 3).reshape(2, 3, 8) @ mha.w_o.weight.data.T,
                               atol=1e-12)
    probe.offset, mha.keep_attention = None, False
    mha(x, causal=True)
    assert probe.probs is None and probe.inputs is None and probe.heads_output is None


def test_attention_swapped_takes_only_an_attention():
    with pytest.raises(TypeError, match="attention_swapped: attention must be an nn.probe.Attention, got function"):
        with attention_swapped(_model(), lambda *args: None):
            pass


def test_the_contract_the_module_calls_is_attention_heads_signature():
    """What MultiHeadAttention passes to ``attention.heads`` is F.scaled_dot_product_attention's
    contract: the same parameters, in the same order, with the same defaults."""
    assert inspect.signature(Attention.heads) == inspect.signature(tf.functional.scaled_dot_product_attention)
