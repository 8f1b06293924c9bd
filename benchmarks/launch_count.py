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
(``--tokens``, default 128) keeps the emulated kernels' time short. ``--cost-model`` predicts the
step at ``--cost-tokens`` (default 4,096, the step of ``bench_step``) without emulating it: every
launch's bytes and FLOPs are affine in the batch's rows at a fixed padded length, so the step is
counted at two batch sizes and each launch extrapolated exactly to the rows of the large batch
(``extrapolated``; tests/engine/kernels/test_launch_count.py checks it against a third count).

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
sys.path.insert(0, HERE)  # benchmarks/ is not a package
from step_batch import make_batch  # noqa: E402
from step_runners import TinyformerGraphedRunner  # noqa: E402
from tinyformer.engine import backend  # noqa: E402
import provenance  # noqa: E402

#: public datasheet peaks (dense): memory bandwidth in bytes/s, FLOP/s by ``Launch.compute``
#: (fp32 and fp64 on CUDA cores, "tensor" the 16-bit tensor-core rate with float32 accumulation)
GPUS = {
    "H100": {"name": "H100 SXM", "bandwidth": 3.35e12, "fp32": 67e12, "fp64": 34e12, "tensor": 989e12},
    "H200": {"name": "H200 SXM", "bandwidth": 4.8e12, "fp32": 67e12, "fp64": 34e12, "tensor": 989e12},
    "A100": {"name": "A100 SXM 80 GB", "bandwidth": 2.039e12, "fp32": 19.5e12, "fp64": 9.7e12, "tensor": 312e12},
    "T4": {"name": "T4", "bandwidth": 320e9, "fp32": 8.1e12, "fp64": 0.25e12, "tensor": 65e12},
}

#: how the families of ``counting_launches`` are grouped in the table
GROUPS = (("attention kernels", lambda f: f.startswith("attention_")),
          ("other tinyformer kernels", lambda f: not f.startswith(("attention_", "cublas", "copy", "cupy", "array op"))),
          ("cuBLAS products", lambda f: f in ("cublas_gemm", "cupy_matmul")),
          ("copies", lambda f: f.startswith("copy")),
          ("array operations", lambda f: f.startswith("array op")))


@contextlib.contextmanager
def on_the_kernel_path(device):
    """On the CPU: the emulated capture, and the fused ops and Adam through the emulated kernels."""
    if device == "cuda":
        yield None
        return
    from tinyformer.testing.emulated_capture import EmulatedCapture
    from tinyformer.engine import kernels
    from tinyformer.engine.kernels import launch
    from tinyformer.testing import emulation

    on_gpu = kernels.on_gpu
    kernels.on_gpu = lambda *arrays: True
    previous = emulation.install()  # kernels on NumPy arrays run through the CPU emulation
    try:
        yield EmulatedCapture()
    finally:
        kernels.on_gpu = on_gpu
        launch.install_host_loader(previous)


def count(preset, precision, args, batch):
    """{family: launches} of one captured step, the graph's node counts on a GPU (else None), seconds."""
    start = time.perf_counter()
    with on_the_kernel_path(args.device) as capture:
        runner = TinyformerGraphedRunner(preset, args.vocab, batch, args.device, args.seed, precision,
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


def extrapolated(small, large, rows_small, rows_large, rows):
    """The launches of a step of ``rows`` rows from those of steps of ``rows_small`` and ``rows_large``
    rows (same padded length): the same sequence, each launch's bytes and FLOPs on the line through
    its two counts (exact: both are affine in the rows, the parameters' share the constant)."""
    if [launch.family for launch in small] != [launch.family for launch in large]:
        raise SystemExit("launch_count: the launch sequence differs between the two batch sizes")
    ratio = (rows - rows_small) / (rows_large - rows_small)
    return [backend.Launch(a.family, round(a.bytes + (b.bytes - a.bytes) * ratio),
                           round(a.flops + (b.flops - a.flops) * ratio), a.compute) for a, b in zip(small, large)]


def predicted_seconds(launch, gpu, floor):
    """One launch's time on ``gpu``: its bytes at peak bandwidth or its FLOPs at the peak of its
    compute, whichever is longer (a roofline), and never under ``floor`` seconds."""
    spec = GPUS[gpu]
    flops_time = launch.flops / spec[launch.compute] if launch.flops and launch.compute != "memory" else 0.0
    return max(floor, launch.bytes / spec["bandwidth"], flops_time)


def cost_table(records, gpu, floor):
    """Markdown rows by group: launches, MB moved, GFLOP, predicted ms, and the launches the floor bounds."""
    lines = [f"| group | launches | MB moved | GFLOP | predicted ms on {GPUS[gpu]['name']} | of them at the floor |",
             "|---|---:|---:|---:|---:|---:|"]
    totals = [0, 0, 0, 0.0, 0]
    for name, belongs in GROUPS:
        mine = [r for r in records if belongs(r.family)]
        times = [predicted_seconds(r, gpu, floor) for r in mine]
        row = [len(mine), sum(r.bytes for r in mine), sum(r.flops for r in mine), sum(times),
               sum(t == floor for t in times)]
        totals = [a + b for a, b in zip(totals, row)]
        lines.append(f"| {name} | {row[0]:,} | {row[1] / 1e6:,.1f} | {row[2] / 1e9:,.2f} | {row[3] * 1e3:.3f} | {row[4]:,} |")
    lines.append(f"| **step** | {totals[0]:,} | {totals[1] / 1e6:,.1f} | {totals[2] / 1e9:,.2f} | "
                 f"**{totals[3] * 1e3:.3f}** | {totals[4]:,} |")
    return lines


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
    parser.add_argument("--cost-model", metavar="GPU", help="predict the step's time on these GPUs (comma-separated: "
                        + ", ".join(GPUS) + ") from each launch's bytes and FLOPs and a per-launch floor")
    parser.add_argument("--cost-tokens", type=int, default=4096, help="target tokens of the step --cost-model "
                        "predicts (default 4096), extrapolated from counts at --tokens and twice that")
    parser.add_argument("--floor-us", type=float, default=3.0, help="the per-launch floor of --cost-model in "
                        "microseconds (default 3: a guess until a GPU measures it)")
    args = parser.parse_args(argv)
    gpus = args.cost_model.split(",") if args.cost_model else []
    unknown = [g for g in gpus if g not in GPUS]
    if unknown:
        parser.error(f"--cost-model: unknown GPU {unknown[0]!r}; known: {', '.join(GPUS)}")
    if args.floor_us < 0:
        parser.error("--floor-us must be >= 0")
    batch = make_batch(args.tokens, args.length, args.vocab, args.seed)
    if gpus:
        larger = make_batch(2 * args.tokens, args.length, args.vocab, args.seed)
        target_rows = make_batch(args.cost_tokens, args.length, args.vocab, args.seed)["src"].shape[0]
    rows, families, costs = [], collections.defaultdict(dict), {}
    device = "the CPU (emulated capture and kernels)"
    if args.device == "cuda":
        import cupy

        device = f"GPU {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}"
    print("Launches per captured training step")
    print(provenance.header(provenance.command_line(), provenance.cpu_model(), device))
    print(f"batch: {batch['src'].shape[0]} rows x {args.length}, {args.tokens} target tokens, vocabulary {args.vocab}")
    for preset in args.preset.split(","):
        for precision in args.precision.split(","):
            launches, nodes, seconds = count(preset, precision, args, batch)
            rows.append((preset, precision, launches, nodes))
            if gpus:
                twice, _, more = count(preset, precision, args, larger)
                costs[preset, precision] = extrapolated(launches.records, twice.records, batch["src"].shape[0],
                                                        larger["src"].shape[0], target_rows)
                seconds += more
            families[f"{preset} {precision}"] = launches
            print(f"{preset} {precision}: {sum(launches.values())} launches counted ({seconds:.0f} s)", flush=True)
    print()
    print("\n".join(table(rows, args.device)))
    for gpu in gpus:
        for preset, precision, launches, _ in rows:
            print()
            print(f"{preset} {precision} at {args.cost_tokens:,} target tokens ({target_rows} rows x {args.length}), "
                  f"predicted on {GPUS[gpu]['name']} ({GPUS[gpu]['bandwidth'] / 1e12:g} TB/s, "
                  f"{GPUS[gpu][precision == 'fp32' and 'fp32' or 'tensor'] / 1e12:g} TFLOP/s for its products, "
                  f"{args.floor_us:g} µs a launch at least):")
            print()
            print("\n".join(cost_table(costs[preset, precision], gpu, args.floor_us * 1e-6)))
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
