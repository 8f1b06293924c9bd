"""Backpropagation through softmax attention: derived by hand, checked three ways.

Scaled dot-product attention (§3.2.1 of "Attention Is All You Need") is

    S = Q Kᵀ / √d_k          scores, masked positions set to −∞
    P = softmax(S)           row by row: each query's distribution over the keys
    O = P V                  the output

Given the gradient dO of a loss L with respect to O, the chain rule, one line at
a time and read backwards, gives

    dV = Pᵀ dO                     O = P V is linear in V
    dP = dO Vᵀ                     ... and linear in P
    dS = P ∘ (dP − rowsum(dP ∘ P)) the softmax Jacobian diag(p) − p pᵀ, applied per row
    dQ = dS K / √d_k               S = Q Kᵀ / √d_k is linear in Q
    dK = dSᵀ Q / √d_k              ... and in K

Masks need no extra rule: a masked key has P = 0, so its dS is 0 whatever dP is,
and it gets no gradient. A query whose keys are all masked has P = 0 (tinyformer's
definition: no NaN), so its whole row of dS is 0.

This script
  1. implements those five lines in NumPy,
  2. compares them with tinyformer's autograd (F.scaled_dot_product_attention),
  3. compares both with central differences (tinyformer.engine.gradcheck, float64, random
     upstream gradient), for a padding mask and for causal + padding,
  4. and goes inside nn.MultiHeadAttention: with ``keep_attention`` on, the attention
     probabilities are a graph tensor (``mha.attention_probs``) whose hook prints
     dL/dP per head, checked against dO Vᵀ by hand, and the hand-derived backward is
     carried through the projections to the input.
It exits with status 1 if any comparison fails.

    python examples/01_backprop_through_attention.py [--seed 0]
"""

import argparse
import math
import sys

import numpy as np

import tinyformer as tf
from tinyformer.engine import functional as F
from tinyformer.model import nn

HAND_TOLERANCE = 1e-12  # hand vs autograd: the same arithmetic in another order


# ------------------------------------------------------------------ the derivation, in NumPy
def attention_forward(q, k, v, keep):
    """(O, P) for q (..., len_q, d_k), k and v (..., len_k, d_k), keep (..., len_q, len_k) boolean."""
    s = np.where(keep, q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1]), -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(row_max), row_max, 0.0))  # exp(−∞) = 0 at masked keys
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total == 0, 1.0, total)  # a row with no key left stays all zeros
    return p @ v, p


def attention_backward(q, k, v, p, d_o):
    """(dQ, dK, dV, dP, dS) from the five lines of the derivation."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    d_v = p.swapaxes(-1, -2) @ d_o
    d_p = d_o @ v.swapaxes(-1, -2)
    d_s = p * (d_p - (d_p * p).sum(axis=-1, keepdims=True))
    d_q = d_s @ k * scale
    d_k = d_s.swapaxes(-1, -2) @ q * scale
    return d_q, d_k, d_v, d_p, d_s


class HandAttention(tf.Function):
    """The NumPy derivation as a tinyformer Function, so the gradient checker can test it."""

    def forward(self, q, k, v, keep):
        out, self.p = attention_forward(q, k, v, keep)
        self.q, self.k, self.v = q, k, v
        return out

    def backward(self, d_o):
        d_q, d_k, d_v, _, _ = attention_backward(self.q, self.k, self.v, self.p, d_o)
        return d_q, d_k, d_v, None


def keep_mask(batch, len_q, len_k, key_lengths, causal):
    """Padding keep-mask (batch, 1, len_q, len_k), with the causal triangle when asked."""
    keep = np.arange(len_k)[None, :] < np.asarray(key_lengths)[:, None]
    keep = np.broadcast_to(keep[:, None, None, :], (batch, 1, len_q, len_k))
    if causal:
        keep = keep & F.causal_mask(len_q, len_k)
    return keep


def max_abs(a, b):
    return float(np.max(np.abs(a - b))) if np.size(a) else 0.0


# ------------------------------------------------------------------ parts 1-3: the bare attention
def check_attention(name, rng, batch, heads, len_q, len_k, d_k, key_lengths, causal):
    """Hand vs autograd vs central differences on one case; returns True when all agree."""
    q, k, v = (rng.standard_normal((batch, heads, n, d_k)) for n in (len_q, len_k, len_k))
    keep = keep_mask(batch, len_q, len_k, key_lengths, causal)
    padding = keep_mask(batch, len_q, len_k, key_lengths, False)[:, :, :1]  # (batch, 1, 1, len_k)
    d_o = rng.standard_normal((batch, heads, len_q, d_k))  # a random upstream gradient

    out, p = attention_forward(q, k, v, keep)
    hand = attention_backward(q, k, v, p, d_o)

    tq, tk, tv = (tf.Tensor(a, requires_grad=True) for a in (q, k, v))
    auto_out = F.scaled_dot_product_attention(tq, tk, tv, mask=padding, causal=causal)
    auto = tf.grad(auto_out, [tq, tk, tv], d_o)

    # The checker draws its own random upstream gradient (seeded) and differences the outputs.
    def fd_hand(a, b, c):
        return HandAttention.apply(a, b, c, keep)

    def fd_auto(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, mask=padding, causal=causal)

    report_hand = tf.gradcheck(fd_hand, [tq, tk, tv], raise_on_failure=False)
    report_auto = tf.gradcheck(fd_auto, [tq, tk, tv], raise_on_failure=False)

    empty_rows = int((~keep.any(axis=-1)).sum())
    print(f"\n{name}: batch {batch}, heads {heads}, len_q {len_q}, len_k {len_k}, d_k {d_k}, "
          f"key lengths {list(key_lengths)}{', causal' if causal else ''}; "
          f"{empty_rows} query row(s) with every key masked")
    print(f"  forward: max |O_hand − O_tinyformer| = {max_abs(out, auto_out.data):.1e}")
    print(f"  {'gradient':<9} {'hand vs autograd':>17} {'hand vs finite diff':>20} "
          f"{'autograd vs finite diff':>24}")
    ok = max_abs(out, auto_out.data) <= HAND_TOLERANCE and report_hand.passed and report_auto.passed
    for i, label in enumerate(("dQ", "dK", "dV")):
        diff = max_abs(hand[i], auto[i])
        ok &= diff <= HAND_TOLERANCE
        print(f"  {label:<9} {diff:>17.1e} {report_hand.inputs[i].max_abs_error:>20.1e} "
              f"{report_auto.inputs[i].max_abs_error:>24.1e}")
    d_s = hand[4]
    print(f"  rows of dS sum to zero (softmax ignores a shift of a row): "
          f"max |rowsum(dS)| = {np.abs(d_s.sum(axis=-1)).max():.1e}")
    print(f"  dS at masked positions: max |dS| = {np.abs(np.where(keep, 0.0, d_s)).max():.1e} "
          f"(while max |dP| there = {np.abs(np.where(keep, 0.0, hand[3])).max():.2f})")
    if not (report_hand.passed and report_auto.passed):
        print(report_hand, report_auto, sep="\n")
    print(f"  {'agree' if ok else 'DISAGREE'}")
    return ok


# ------------------------------------------------------------------ part 4: inside MultiHeadAttention
def split_heads(x, heads):
    batch, length, d_model = x.shape
    return x.reshape(batch, length, heads, d_model // heads).transpose(0, 2, 1, 3)


def merge_heads(x):
    batch, heads, length, d_k = x.shape
    return x.transpose(0, 2, 1, 3).reshape(batch, length, heads * d_k)


def check_multi_head(rng, d_model=8, heads=2, length=4):
    """dL/dP from the hook point, and the whole backward by hand down to the input x."""
    mha = nn.MultiHeadAttention(d_model, heads, keep_attention=True).double()
    x = tf.Tensor(rng.standard_normal((2, length, d_model)), requires_grad=True)
    key_lengths = [length, length - 1]
    padding = keep_mask(2, length, length, key_lengths, False)[:, :, :1]
    d_y = rng.standard_normal((2, length, d_model))

    y = mha(x, mask=padding, causal=True)
    seen = {}
    mha.attention_probs.register_hook(lambda g: seen.setdefault("dP", g.copy()))
    (d_x,) = tf.grad(y, [x], d_y)

    print(f"\nInside nn.MultiHeadAttention (d_model {d_model}, {heads} heads, causal self-attention, "
          f"key lengths {key_lengths}), with mha.keep_attention = True:")
    print("  mha.attention_probs.register_hook(fn) receives dL/dP, shape", seen["dP"].shape)
    for h in range(heads):
        print(f"  head {h}, sentence 0: P and dL/dP")
        rows_p = np.array2string(mha.attention_probs.data[0, h], precision=3, suppress_small=True)
        rows_d = np.array2string(seen["dP"][0, h], precision=3, suppress_small=True)
        for line_p, line_d in zip(rows_p.splitlines(), rows_d.splitlines()):
            print(f"    {line_p:<36} {line_d}")
    print("  dL/dP is dense above the diagonal too: P is zero there, so dS = P∘(...) kills it.")

    # By hand. Each projection is Linear: z = x Wᵀ + b, so dx = dz W and the heads are a reshape.
    def project(linear):
        return split_heads(x.data @ linear.weight.data.T + linear.bias.data, heads)

    q, k, v = project(mha.w_q), project(mha.w_k), project(mha.w_v)
    keep = keep_mask(2, length, length, key_lengths, True)
    _, p = attention_forward(q, k, v, keep)
    d_o = split_heads(d_y @ mha.w_o.weight.data, heads)  # y = concat(O) W_Oᵀ + b_O
    d_q, d_k, d_v, d_p, _ = attention_backward(q, k, v, p, d_o)
    d_x_hand = sum(merge_heads(g) @ linear.weight.data
                   for g, linear in ((d_q, mha.w_q), (d_k, mha.w_k), (d_v, mha.w_v)))
    diff_p, diff_x = max_abs(seen["dP"], d_p), max_abs(d_x, d_x_hand)
    report = tf.gradcheck(lambda a: mha(a, mask=padding, causal=True), [x], raise_on_failure=False)
    print(f"  max |dL/dP (hook) − dO·Vᵀ (hand)| = {diff_p:.1e}")
    print(f"  max |dL/dx (autograd) − dQ·W_Q + dK·W_K + dV·W_V (hand)| = {diff_x:.1e}")
    print(f"  dL/dx autograd vs finite differences: max abs err "
          f"{report.inputs[0].max_abs_error:.1e} ({'passed' if report.passed else 'FAILED'})")
    ok = diff_p <= HAND_TOLERANCE and diff_x <= HAND_TOLERANCE and report.passed
    print(f"  {'agree' if ok else 'DISAGREE'}")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    tf.manual_seed(args.seed)  # the projections' initialisation
    print(__doc__.split("This script")[0].rstrip())
    print("\nmax abs differences (the finite-difference columns come from tinyformer.engine.gradcheck, "
          "float64, central differences, random upstream gradient):")
    with np.printoptions(linewidth=120):
        ok = check_attention("Cross-attention with padding", rng, batch=2, heads=2, len_q=3, len_k=5,
                             d_k=4, key_lengths=[5, 3], causal=False)
        ok &= check_attention("Causal self-attention with padding", rng, batch=2, heads=2, len_q=4,
                              len_k=4, d_k=4, key_lengths=[4, 2], causal=True)
        ok &= check_attention("Causal self-attention with a fully padded sentence", rng, batch=2,
                              heads=1, len_q=3, len_k=3, d_k=2, key_lengths=[3, 0], causal=True)
        ok &= check_multi_head(rng)
    if not ok:
        print("\nFAILED: the hand-derived backward, autograd and finite differences disagree")
        return 1
    print("\nhand-derived backward, autograd and finite differences agree")
    return 0

if __name__ == "__main__":
    sys.exit(main())
