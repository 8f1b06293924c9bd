# tinyformer's reference solution of this exercise: its backward function, which a reader writes into
# the file `tinyformer study start` writes (tests/study/test_course.py puts it in place and checks it passes).
# ruff: noqa: F821 -- numpy, forward and the other names are the template's, where this function goes.

def backward(query, key, value, params, heads, mask, causal, d_out):
    """{"query": …, "key": …, "value": …, "w_q": …, …, "b_o": …}: ∂L/∂ each, given d_out = ∂L/∂out.

    Recompute what you need of the forward pass here (its helper functions are yours to call)."""
    q = split_heads(linear(query, params["w_q"], params["b_q"]), heads)
    k = split_heads(linear(key, params["w_k"], params["b_k"]), heads)
    v = split_heads(linear(value, params["w_v"], params["b_v"]), heads)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = numpy.where(keep_mask(mask, causal, q.shape[-2], k.shape[-2]), q @ k.swapaxes(-1, -2) * scale, -numpy.inf)
    p = softmax(s)
    merged = merge_heads(p @ v)
    grads = {}

    def linear_backward(x, w, dy, name):  # y = x Wᵀ + b: dx = dy W, dW = dyᵀ x, db = Σ dy
        grads["w_" + name] = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])
        grads["b_" + name] = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
        return dy @ w

    d_heads = split_heads(linear_backward(merged, params["w_o"], d_out, "o"), heads)
    dv = p.swapaxes(-1, -2) @ d_heads
    dp = d_heads @ v.swapaxes(-1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = ds @ k * scale
    dk = ds.swapaxes(-1, -2) @ q * scale
    grads["query"] = linear_backward(query, params["w_q"], merge_heads(dq), "q")
    grads["key"] = linear_backward(key, params["w_k"], merge_heads(dk), "k")
    grads["value"] = linear_backward(value, params["w_v"], merge_heads(dv), "v")
    return grads
