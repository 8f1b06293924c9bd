"""kernels/attention.py states once what the attention kernels take (``input_problem``): its
launchers raise the problem it names, and the functional op asks it before it picks its kernel
path. No compiler needed: every call here is refused before a launch."""

import re

import numpy as np
import pytest

from tinyformer import Tensor
from tinyformer.engine import functional as F, kernels
from tinyformer.engine.kernels import attention as attention_kernel

X = np.zeros((2, 3, 5, 32), np.float32)

# name: (q, k, v, split_heads, the exception, its message)
PROBLEMS = {
    "split-heads-rank": (X[0], X[0], X[0], True, ValueError, r"\(batch, heads, len, head_dim\)"),
    "flat-rank": (X, X, X, False, ValueError, r"\(batch·heads, len, head_dim\)"),
    "k-and-v-differ": (X, X, X[:, :, :4], True, ValueError, "shapes do not agree"),
    "heads-differ": (X, X[:, :1], X[:, :1], True, ValueError, "shapes do not agree"),
    "head-dims-differ": (X, X[..., :16], X[..., :16], True, ValueError, "shapes do not agree"),
    "head-dim-without-kernel": (*(np.zeros((1, 2, 4, 48), np.float32),) * 3, True, ValueError, "head dimension 48"),
    "dtypes-differ": (X, X, X.astype(np.float16), True, TypeError, "share a dtype"),
    "flat-dtypes-differ": (X[0], X[0], X[0].astype(np.float16), False, TypeError, "share a dtype"),
}


@pytest.mark.parametrize("name", PROBLEMS)
def test_the_launchers_raise_the_problem_input_problem_names(name):
    q, k, v, split_heads, error, message = PROBLEMS[name]
    problem = attention_kernel.input_problem(q, k, v, split_heads)
    assert isinstance(problem, error) and re.search(message, str(problem))
    with pytest.raises(error, match=message):
        if split_heads:
            attention_kernel.attention_mma_forward(q, k, v)
        else:
            attention_kernel.attention_forward(q, k, v, heads=1)


def test_what_the_kernels_take_has_no_problem():
    assert attention_kernel.input_problem(X, X, X) is None
    assert attention_kernel.input_problem(X, X[:, :, :4], X[:, :, :4]) is None  # len_q != len_k
    assert attention_kernel.input_problem(X[0], X[0], X[0], split_heads=False) is None


def test_the_functional_op_asks_input_problem_before_taking_the_kernel(monkeypatch):
    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)  # NumPy arrays "on the GPU"
    asked = []

    def refusing(q, k, v, split_heads=True):
        asked.append((q.shape, k.shape, v.shape, split_heads))
        return ValueError("refused for the test")

    monkeypatch.setattr(attention_kernel, "input_problem", refusing)
    q, k, v = (Tensor(X.copy(), requires_grad=True) for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v)
    assert asked == [(X.shape, X.shape, X.shape, True)]
    assert out.grad_fn.uses_kernel is False  # the reference ran
