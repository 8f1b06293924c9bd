"""Launches per captured training step, by family: on the CPU through the emulated capture and the
emulated CUDA kernels (no GPU needed), on a GPU through the real capture, with the CUDA driver's
count of the graph's nodes beside it.

The step is ``bench_step``'s (forward, backward, Adam; label smoothing 0.1; dropout as the preset
has it) run by ``train.graphs.GraphedStep`` as ``tinyformer train --cuda-graphs on`` runs it: one
eager warm-up step, then the captured one. Its launches are counted where the engine issues them
(``backend.counting_launches``): each kernel of ``engine.kernels`` by name, each cuBLAS product and
the copies it needs, and, in the emulated capture, each array operation on device memory (the
kernels CuPy would launch for it: gradient sums, fills, casts). On a GPU the array operations are
CuPy's own and are not seen by the engine; the graph's node count (kernel, memset and memcpy nodes)
is the whole.

The count depends on the model's structure and the precision, not on the batch: a small batch
(``--tokens``, default 128) keeps the emulated kernels' time short.

    python benchmarks/launch_count.py [--preset small,base] [--precision fp32,bf16] [--markdown]
    python benchmarks/launch_count.py --device cuda ...
"""

import argparse
import collections
import contextlib
import os
import sys
import time

import tinyformer  # noqa: F401  first: its OpenBLAS setting must precede NumPy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]
import bench_step  # noqa: E402
import provenance  # noqa: E402

#: how the families of ``counting_launches`` are grouped in the table
GROUPS = (("attention kernels", lambda f: f.startswith("attention_")),
          ("other tinyformer kernels", lambda f: not f.startswith(("attention_", "cublas", "copy", "cupy", "array op"))),
          ("cuBLAS products", lambda f: f in ("cublas_gemm", "cupy_matmul")),
          ("copies for products", lambda f: f.startswith("copy")),
          ("array operations", lambda f: f.startswith("array op")))


@contextlib.contextmanager
def on_the_kernel_path(device):
    """On the CPU: the emulated capture, and the fused ops and Adam through the emulated kernels."""
    if device == "cuda":
        yield None
        return
    from emulated_capture import EmulatedCapture
    from tinyformer.engine import kernels

    on_gpu = kernels.on_gpu
    kernels.on_gpu = lambda *arrays: True
    try:
        yield EmulatedCapture()
    finally:
        kernels.on_gpu = on_gpu


def count(preset, precision, args, batch):
    """{family: launches} of one captured step, the graph's node counts on a GPU (else None), seconds."""
    start = time.perf_counter()
    with on_the_kernel_path(args.device) as capture:
        runner = bench_step.TinyformerGraphedRunner(preset, args.vocab, batch, args.device, args.seed, precision,
                                                    capture=capture)
        runner.step()  # eager, on the graph stream
        runner.step()  # captured, then replayed
    if runner.unavailable():
        raise SystemExit(f"launch_count: {preset} {precision}: {runner.unavailable()}")
    (launches,) = runner.graphed.launch_counts().values()
    nodes = None
    if args.device == "cuda":
        from tinyformer.engine import backend

        (entry,) = [e for e in runner.graphed.entries.values() if e.graph is not None]
        nodes = backend.graph_nodes(entry.graph.graph)
    return launches, nodes, time.perf_counter() - start


def table(rows, device):
    header = ["preset", "precision", *[name for name, _ in GROUPS], "counted in all"]
    if device == "cuda":
        header += ["graph kernel nodes", "memset nodes", "memcpy nodes", "other nodes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for preset, precision, launches, nodes in rows:
        cells = [preset, precision]
        cells += [f"{sum(n for f, n in launches.items() if belongs(f)):,}" for _, belongs in GROUPS]
        cells.append(f"{sum(launches.values()):,}")
        if nodes is not None:
            other = sum(n for kind, n in nodes.items() if kind not in ("kernel", "memset", "memcpy"))
            cells += [f"{nodes['kernel']:,}", f"{nodes['memset']:,}", f"{nodes['memcpy']:,}", f"{other:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small,base", help="comma-separated presets (default small,base)")
    parser.add_argument("--precision", default="fp32,bf16", help="comma-separated precisions (default fp32,bf16)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--tokens", type=int, default=128, help="target tokens of the batch (default 128)")
    parser.add_argument("--length", type=int, default=32, help="padded length (default 32)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", action="store_true", help="also list every family's count")
    args = parser.parse_args(argv)
    batch = bench_step.make_batch(args.tokens, args.length, args.vocab, args.seed)
    rows, families = [], collections.defaultdict(dict)
    device = "the CPU (emulated capture and kernels)"
    if args.device == "cuda":
        import cupy

        device = f"GPU {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}"
    print("Launches per captured training step")
    print(provenance.header(bench_step.command_line(), bench_step.cpu_model(), device))
    print(f"batch: {batch['src'].shape[0]} rows x {args.length}, {args.tokens} target tokens, vocabulary {args.vocab}")
    for preset in args.preset.split(","):
        for precision in args.precision.split(","):
            launches, nodes, seconds = count(preset, precision, args, batch)
            rows.append((preset, precision, launches, nodes))
            families[f"{preset} {precision}"] = launches
            print(f"{preset} {precision}: {sum(launches.values())} launches counted ({seconds:.0f} s)", flush=True)
    print()
    print("\n".join(table(rows, args.device)))
    if args.families:
        names = sorted({f for launches in families.values() for f in launches})
        print()
        print("| family | " + " | ".join(families) + " |")
        print("|---|" + "---:|" * len(families))
        for name in names:
            print(f"| {name} | " + " | ".join(str(launches.get(name, 0)) for launches in families.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
