"""Row-block work in cache-sized pieces (issue 49): the step's row-wise ops timed with each piece size.

    python benchmarks/bench_row_blocks.py [--pieces 1099511627776,262144,65536] [--repeats 7]

For each ``backend.threads.CACHE_BLOCK_ELEMENTS`` given (a huge value: one piece per thread, as
before the pieces), the median milliseconds of: the loss (label-smoothed cross entropy, forward and
backward) over 4,096 × 8,000 logits, layer norm forward and backward over 4,096 × 256, the feed-
forward net's first layer with ReLU and dropout (4,096 × 256 → 1,024), and one Adam step over
`small`-sized weights (8,000 × 256 and twelve 1,024 × 256), with tinyformer's default threads.
"""

import argparse
import os
import sys
import time

import tinyformer as tf  # first: it sets OpenBLAS's quick sleep before NumPy loads it
import numpy as np
import tinyformer.engine.functional as F
from tinyformer.engine import backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import provenance  # noqa: E402  (benchmarks/ is not a package)


def workloads(rng):
    logits, target = rng.standard_normal((4096, 8000)).astype(np.float32), rng.integers(1, 8000, 4096)
    x = rng.standard_normal((4096, 256)).astype(np.float32)
    gamma, beta = np.ones(256, np.float32), np.zeros(256, np.float32)
    w1, b1 = rng.standard_normal((1024, 256)).astype(np.float32), np.zeros(1024, np.float32)
    params = [tf.nn.Parameter(rng.standard_normal(shape).astype(np.float32))
              for shape in [(8000, 256)] + [(1024, 256)] * 12]
    for p in params:
        p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
    adam = tf.optim.Adam(params, lr=1e-3)

    def loss():
        leaf = tf.Tensor(logits, requires_grad=True)
        F.cross_entropy(leaf, target, 0.1, ignore_index=0).backward()

    def layer_norm():
        F.layer_norm(tf.Tensor(x, requires_grad=True), tf.Tensor(gamma), tf.Tensor(beta)).backward(tf.Tensor(x))

    def linear_relu_dropout():
        F.linear_relu_dropout(tf.Tensor(x), tf.Tensor(w1), tf.Tensor(b1), 0.1, generator=np.random.default_rng(1))

    return {"loss 4096x8000": loss, "layer norm 4096x256": layer_norm,
            "linear+ReLU+dropout 4096x256->1024": linear_relu_dropout, "Adam step (small-sized)": adam.step}


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", default=f"{1 << 40},{1 << 18},{1 << 16}",
                        help="CACHE_BLOCK_ELEMENTS values, comma-separated")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    print(provenance.header("python benchmarks/bench_row_blocks.py " + " ".join(sys.argv[1:])))
    print(f"{backend.get_num_threads()} row-block threads")
    work = workloads(np.random.default_rng(0))
    print("| piece (elements) | " + " | ".join(f"{name} ms" for name in work) + " |")
    print("|---:|" + "---:|" * len(work))
    default = backend.threads.CACHE_BLOCK_ELEMENTS
    try:
        for piece in (int(p) for p in args.pieces.split(",")):
            backend.threads.CACHE_BLOCK_ELEMENTS = piece
            print(f"| {piece:,} | " + " | ".join(f"{median_ms(fn, args.repeats):.1f}" for fn in work.values()) + " |",
                  flush=True)
    finally:
        backend.threads.CACHE_BLOCK_ELEMENTS = default


if __name__ == "__main__":
    main()
