"""Per-op overhead of the autograd engine: a long chain of small elementwise ops.

Times forward + backward of a chain of ``--ops`` elementwise ops on (32, 32)
float32 arrays, where the arithmetic is negligible and what is measured is the
framework's bookkeeping per op. With PyTorch installed (the ``bench`` extra) the
same chain runs in PyTorch in the same process, and the ratio is printed.

    python benchmarks/bench_engine.py [--ops 10000] [--repeats 5] [--threads 1]
"""

import argparse
import os
import platform
import statistics
import time

import numpy

# The ops of the chain, in order, cycling: binary ops with a second tensor of
# the same shape, a binary op with a Python scalar, and unary ops. Each step is
# exactly one op in both frameworks; the values stay in a tame range.
CHAIN = ("mul_w", "add_b", "tanh", "mul_scalar", "sub_b", "exp", "div_w", "relu")


def run_chain(x, w, b, n_ops, tanh, exp, relu):
    for i in range(n_ops):
        op = CHAIN[i % len(CHAIN)]
        if op == "mul_w":
            x = x * w
        elif op == "add_b":
            x = x + b
        elif op == "tanh":
            x = tanh(x)
        elif op == "mul_scalar":
            x = x * 0.9
        elif op == "sub_b":
            x = x - b
        elif op == "exp":
            x = exp(x)
        elif op == "div_w":
            x = x / w
        else:
            x = relu(x)
    return x


def time_tinyformer(values, n_ops):
    import tinyformer as tf

    x = tf.Tensor(values[0], requires_grad=True)
    w = tf.Tensor(values[1], requires_grad=True)
    b = tf.Tensor(values[2], requires_grad=True)
    start = time.perf_counter()
    y = run_chain(x, w, b, n_ops, lambda t: t.tanh(), lambda t: t.exp(), lambda t: t.relu())
    middle = time.perf_counter()
    y.sum().backward()
    end = time.perf_counter()
    return middle - start, end - middle, x.grad


def time_torch(values, n_ops):
    import torch

    x, w, b = (torch.tensor(v, requires_grad=True) for v in values)
    start = time.perf_counter()
    y = run_chain(x, w, b, n_ops, torch.tanh, torch.exp, torch.relu)
    middle = time.perf_counter()
    y.sum().backward()
    end = time.perf_counter()
    return middle - start, end - middle, x.grad.numpy()


def measure(timer, values, n_ops, repeats):
    timer(values, min(n_ops, 1000))  # warm-up
    forward, backward = [], []
    for _ in range(repeats):
        f, b, grad = timer(values, n_ops)
        forward.append(f)
        backward.append(b)
    return statistics.median(forward), statistics.median(backward), grad


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()

    rng = numpy.random.default_rng(0)
    values = [
        rng.uniform(0.5, 1.0, (32, 32)).astype(numpy.float32),
        rng.uniform(0.9, 1.1, (32, 32)).astype(numpy.float32),
        rng.uniform(-0.1, 0.1, (32, 32)).astype(numpy.float32),
    ]
    print(f"chain of {args.ops} elementwise ops on (32, 32) float32, median of {args.repeats}")
    print(f"python {platform.python_version()}, numpy {numpy.__version__}, "
          f"{platform.machine()}, {os.cpu_count()} cpus")
    f, b, ours = measure(time_tinyformer, values, args.ops, args.repeats)
    per_op = (f + b) / args.ops * 1e6
    print(f"tinyformer: forward {f / args.ops * 1e6:.2f} us/op, backward {b / args.ops * 1e6:.2f} "
          f"us/op, total {per_op:.2f} us/op")
    try:
        import torch
    except ImportError:
        print("torch not installed (pip install '.[bench]'): no side-by-side figure")
        return
    torch.set_num_threads(args.threads)
    tf_, tb, theirs = measure(time_torch, values, args.ops, args.repeats)
    torch_per_op = (tf_ + tb) / args.ops * 1e6
    print(f"torch {torch.__version__}: forward {tf_ / args.ops * 1e6:.2f} us/op, backward "
          f"{tb / args.ops * 1e6:.2f} us/op, total {torch_per_op:.2f} us/op")
    print(f"ratio tinyformer / torch: {per_op / torch_per_op:.2f}x (target: at most 2x)")
    print(f"gradients agree: {numpy.allclose(ours, theirs, rtol=1e-3, atol=1e-5)}")


if __name__ == "__main__":
    main()
