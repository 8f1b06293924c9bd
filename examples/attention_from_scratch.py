"""Backpropagation through attention, from elementary ops, then training it.

This script builds single-head scaled dot-product attention (§3.2.1 of
"Attention Is All You Need") out of tinyformer's elementary Tensor ops,

    softmax(Q Kᵀ / √d_k) V,

checks its gradient numerically, looks at the gradient arriving at the
attention probabilities with a hook, and then trains it with plain SGD on a
small retrieval task: given a query that is a noisy copy of one of T keys,
return the value stored under that key. Attention has to learn to match the
query with the right key to solve it.

    python examples/attention_from_scratch.py [--steps 300] [--seed 0]
"""

import argparse
import math
import time

import numpy as np

import tinyformer as tf
from tinyformer import Tensor


def softmax(scores):
    """Row softmax from elementary ops: the max is subtracted for stability."""
    shifted = scores - scores.max(axis=-1, keepdims=True).detach()
    weights = shifted.exp()
    return weights / weights.sum(axis=-1, keepdims=True)


class Attention:
    """One head: project query, keys and values, attend, project back."""

    def __init__(self, d_model, d_k, rng):
        def init(rows, cols):  # Xavier-uniform
            limit = math.sqrt(6 / (rows + cols))
            return Tensor(rng.uniform(-limit, limit, (rows, cols)), requires_grad=True)

        self.w_q, self.w_k = init(d_model, d_k), init(d_model, d_k)
        self.w_v, self.w_o = init(d_model, d_k), init(d_k, d_model)
        self.d_k = d_k
        self.last_scores = self.last_weights = None

    def parameters(self):
        return [self.w_q, self.w_k, self.w_v, self.w_o]

    def __call__(self, query, keys, values):
        q = query @ self.w_q  # (batch, 1, d_k)
        k = keys @ self.w_k  # (batch, T, d_k)
        v = values @ self.w_v  # (batch, T, d_k)
        scores = q @ k.swapaxes(-1, -2) / math.sqrt(self.d_k)  # (batch, 1, T)
        weights = softmax(scores)
        self.last_scores, self.last_weights = scores, weights
        return (weights @ v) @ self.w_o  # (batch, 1, d_model)


def make_batch(rng, batch, length, d_model, noise=0.3):
    keys = rng.standard_normal((batch, length, d_model))
    values = rng.standard_normal((batch, length, d_model))
    target_index = rng.integers(0, length, batch)
    query = keys[np.arange(batch), target_index][:, None, :]
    query = query + noise * rng.standard_normal(query.shape)
    target = values[np.arange(batch), target_index][:, None, :]
    return Tensor(query), Tensor(keys), Tensor(values), Tensor(target), target_index


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=8, help="keys per example (T)")
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    model = Attention(args.d_model, args.d_model, rng)

    print("1. Gradient check of attention built from elementary ops (float64, random upstream):")
    small = Attention(4, 3, np.random.default_rng(1))
    q, k, v, _, _ = make_batch(np.random.default_rng(2), 2, 3, 4)
    report = tf.gradcheck(lambda *ws: small(q, k, v), small.parameters())
    print(report, end="\n\n")

    print("2. Gradients at the probabilities P and at the scores S = QKᵀ/√d_k (hooks):")
    q, k, v, target, _ = make_batch(rng, 1, args.length, args.d_model)
    out = model(q, k, v)
    show = lambda name: lambda g: print(f"   {name} =", np.array2string(g[0, 0], precision=4))
    model.last_weights.register_hook(show("dL/dP"))
    model.last_scores.register_hook(show("dL/dS"))
    ((out - target) ** 2).mean().backward()
    print("   softmax's backward maps dP to dS = P∘(dP − rowsum(dP∘P)): each row of dS sums to 0,")
    print("   since adding a constant to every score of a row leaves P unchanged.\n")

    print(f"3. Training with SGD: {args.steps} steps, batch {args.batch}, T={args.length}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        q, k, v, target, index = make_batch(rng, args.batch, args.length, args.d_model)
        loss = ((model(q, k, v) - target) ** 2).mean()
        for p in model.parameters():
            p.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= args.lr * p.grad
        if step == 1 or step % 50 == 0 or step == args.steps:
            hits = model.last_weights.data[:, 0].argmax(axis=-1) == index
            print(f"   step {step:4d}  loss {loss.item():.4f}  "
                  f"attends to the right key: {hits.mean():.0%}")
    print(f"   {time.perf_counter() - start:.1f} s; chance level is {1 / args.length:.0%}")


if __name__ == "__main__":
    main()
