"""The step benchmark's report: the lines that say how and where it ran, the table of step times
(with PyTorch's beside them), or with ``--cuda-graphs`` the table of the four ways of running a
step, and the notes under each table that say what every column means."""

import datetime
import platform

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy
import numpy

import provenance
from step_measure import GRAPH_RUNNERS, GRAPH_TARGETS, PEAK_SHAPES, PRIMING_STEPS
from step_torch import TorchGraphedRunner


# ----------------------------------------------------------------------------- the lines before the tables
def print_preamble(args, batch, torch):
    """What was run, when, where, with which versions, in which order, on which batch."""
    rows, length = batch["src"].shape
    print("One training step (forward, backward, Adam) per preset")
    print(f"command: {provenance.command_line()}")
    print(f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    print(f"machine: {provenance.machine_line()}")
    versions = f"python {platform.python_version()}, numpy {numpy.__version__}"
    if torch is not None:
        threads = torch.get_num_threads()
        versions += f", torch {torch.__version__} ({threads} intra-op thread{'s' if threads != 1 else ''})"
    if args.device == "cuda":
        import cupy

        versions += f", cupy {cupy.__version__} on {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}"
    print(f"versions: {versions}")
    print(f"numpy BLAS: {provenance.blas_info()}")
    print(f"precision: {args.precision}" + ("" if args.precision == "fp32" else
          " (fp32 master weights and Adam; products and attention in the half type; PyTorch under torch.autocast"
          + (" with GradScaler)" if args.precision == "fp16" else ")")))
    print(f"device: {args.device}; median and fastest of {args.repeats} timed steps after {args.warmup} "
          f"warm-up step(s){step_order(args)}")
    print(f"batch: {rows} sentence pairs, src {rows}x{length} and tgt {rows}x{length} (padded), "
          f"{batch['tgt_tokens']:,} target tokens (non-pad tgt_out positions, fairseq's ntokens; "
          f"{1 - batch['tgt_tokens'] / (rows * length):.0%} padding) and {batch['src_tokens']:,} source tokens; "
          f"shared vocabulary of {args.vocab:,}; label smoothing 0.1, pad ignored; dropout as in the preset")
    print()


def step_order(args):
    """How the runners' steps follow each other, as the preamble's device line ends."""
    interleaved = args.order == "interleaved"
    if args.cuda_graphs:
        return (", the steps of tinyformer graphs, tinyformer eager" + (", PyTorch eager and PyTorch graphs"
                if args.vs_torch else "") + (" interleaved" if interleaved else " back to back, one after the other"))
    if not args.vs_torch:
        return ""
    return ", tinyformer and PyTorch steps interleaved" if interleaved else ", all tinyformer steps, then all PyTorch steps"


def print_peak(peak):
    """The measured sgemm peak that the MFU columns divide by (nothing where none was measured)."""
    if peak:
        print(f"sgemm peak (NumPy float32, best of 5 for each of "
              f"{', '.join('x'.join(map(str, s)) for s in PEAK_SHAPES)} as m x k x n): {peak:,.0f} GFLOP/s")
        print()


# ----------------------------------------------------------------------------- tables
def mb(value):
    """Bytes as whole MiB, or n/a."""
    return "n/a" if value is None else f"{value / 2**20:,.0f}"


def print_table(header, rows, markdown):
    """The table as markdown, or as aligned plain text (the first column left, the others right)."""
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    print(fmt(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(fmt(row))


# ----------------------------------------------------------------------------- the table without --cuda-graphs
def step_table(results, batch, args, peak):
    """(header, rows) of the step times: tinyformer's, and with --vs-torch PyTorch's and the ratio;
    MFU where the peak was measured; the memory columns of the device."""
    rows, length = batch["src"].shape
    tokens = batch["tgt_tokens"]
    header = ["preset", "params", "batch", "tgt tokens", "median ms", "min ms", "tokens/s"]
    header += ["MFU"] if peak else []
    header += ["pool MB"] if args.device == "cuda" else ["traced MB"] + (["RSS MB"] if args.rss else [])
    if args.vs_torch:
        header += ["torch median ms", "torch min ms", "torch tokens/s"] + (["torch MFU"] if peak else [])
        header += ["torch pool MB"] if args.device == "cuda" else (["torch RSS MB"] if args.rss else [])
        header += ["ratio"]
    table = []
    for r in results:
        params = f"{r['params'] / 1e6:.2f} M"
        if args.vs_torch and r["torch_params"] != r["params"]:
            params += f" / {r['torch_params'] / 1e6:.2f} M"
        row = [r["preset"], params, f"{rows}x{length}", f"{tokens:,}"] + _times(r, "tf", tokens, peak)
        if args.device == "cuda":
            row.append(mb(r.get("tf_mem")))
        else:
            row += [mb(r.get("tf_traced"))] + ([mb(r.get("tf_rss"))] if args.rss else [])
        if args.vs_torch:
            row += _times(r, "torch", tokens, peak)
            if args.device == "cuda":
                row.append(mb(r.get("torch_mem")))
            elif args.rss:
                row.append(mb(r.get("torch_rss")))
            row.append(f"{r['tf_median'] / r['torch_median']:.2f}x")
        table.append(row)
    return header, table


def _times(r, name, tokens, peak):
    """Median and fastest ms, tokens/s and (with a peak) MFU of runner ``name``."""
    median = r[f"{name}_median"]
    cells = [f"{median * 1e3:,.0f}", f"{r[f'{name}_min'] * 1e3:,.0f}", f"{tokens / median:,.0f}"]
    return cells + ([f"{r['flops'] / median / (peak * 1e9):.1%}"] if peak else [])


def print_step_report(results, batch, args, peak, notes):
    """The table, what its columns mean, then ``notes`` and each preset's last losses."""
    print_table(*step_table(results, batch, args, peak), args.markdown)
    print()
    print("ms: wall time of one whole step (time.perf_counter); tokens/s: target tokens / median step time.")
    if peak:
        print("MFU: model FLOPs (6 · parameters · target tokens + attention, see model_flops) / median step "
              "time / the sgemm peak above.")
    if args.device == "cuda":
        print("pool MB: growth of the GPU memory pool (CuPy's default pool; torch.cuda.max_memory_allocated "
              "for PyTorch) during one untimed step, above what was allocated before it.")
    else:
        print("traced MB: peak of the NumPy/Python memory allocated during one untimed step and live at "
              "once (tracemalloc): activations, gradients, temporaries; parameters and Adam moments "
              "allocated earlier are not in it.")
        if args.rss:
            print("RSS MB: peak resident set during one untimed step minus the resident set before it, "
                  "after malloc_trim (Linux VmHWM reset via /proc/self/clear_refs); the same method for "
                  "both frameworks.")
    if args.vs_torch:
        print("ratio: tinyformer median / PyTorch median (above 1: tinyformer slower).")
    for r in results:
        line = f"{r['preset']}: loss at the last timed step, tinyformer {r['tf_loss']:.4f}"
        if args.vs_torch:
            line += f", PyTorch {r['torch_loss']:.4f}"
        notes.append(line)
    for line in notes:
        print(line)


# ----------------------------------------------------------------------------- the table with --cuda-graphs
def _ms(r, name):
    return "n/a" if name in r["missing"] or f"{name}_median" not in r else f"{r[f'{name}_median'] * 1e3:,.1f}"


def _ratio(r, name, other):
    if any(n in r["missing"] or f"{n}_median" not in r for n in (name, other)):
        return "n/a"
    return f"{r[f'{name}_median'] / r[f'{other}_median']:.2f}x"


def _count(value):
    return "n/a" if value is None else f"{value:,}"


def graphs_table(results, rows, length, tgt_tokens, vs_torch):
    """(header, rows) of the --cuda-graphs table; a figure that was not measured is n/a."""
    header = ["preset", "params", "batch", "tgt tokens", "graphs ms", "eager ms"]
    if vs_torch:
        header += ["torch eager ms", "torch graphs ms", "graphs / torch eager", "graphs / torch graphs"]
    header += ["launches/step"] + (["torch eager launches/step"] if vs_torch else []) + ["graph pool MB"]
    table = []
    for r in results:
        row = [r["preset"], f"{r['params'] / 1e6:.2f} M", f"{rows}x{length}", f"{tgt_tokens:,}",
               _ms(r, "tf_graphs"), _ms(r, "tf")]
        if vs_torch:
            row += [_ms(r, "torch"), _ms(r, "torch_graphs"), _ratio(r, "tf_graphs", "torch"),
                    _ratio(r, "tf_graphs", "torch_graphs")]
        row.append("n/a" if "tf_graphs" in r["missing"] else _count(r.get("tf_graphs_launches")))
        if vs_torch:
            row.append(_count(r.get("torch_launches")))
        row.append("n/a" if "tf_graphs" in r["missing"] else mb(r.get("tf_graphs_pool")))
        table.append(row)
    return header, table


def graphs_notes(results, vs_torch, precision):
    """The lines under the --cuda-graphs table: targets met or not, missing figures, last losses."""
    lines = []
    for r in results:
        preset = r["preset"]
        if vs_torch and preset in GRAPH_TARGETS:
            ratio, target = _ratio(r, "tf_graphs", "torch"), GRAPH_TARGETS[preset]
            verdict = ("not measured" if ratio == "n/a" else
                       "met" if r["tf_graphs_median"] <= target * r["torch_median"] else "not met")
            lines.append(f"{preset}: tinyformer graphs / PyTorch eager {ratio} in {precision}; issue 17's target at "
                         f"most {target}x: {verdict}")
        for name, reason in r["missing"].items():
            lines.append(f"{preset}: {GRAPH_RUNNERS[name]}: not measured: {reason}")
        losses = [f"{label} {r[f'{name}_loss']:.4f}" for name, label in GRAPH_RUNNERS.items()
                  if r.get(f"{name}_loss") is not None and name not in r["missing"]]
        lines.append(f"{preset}: loss at the last timed step, " + ", ".join(losses)
                     + " (the graphed runners also trained on their priming steps)")
    return lines


def print_graphs_report(results, batch, args, notes):
    """The --cuda-graphs table, what its columns mean, then ``notes`` and the targets' verdicts."""
    rows, length = batch["src"].shape
    header, table = graphs_table(results, rows, length, batch["tgt_tokens"], args.vs_torch)
    print_table(header, table, args.markdown)
    print()
    print(f"ms: wall time of one whole step (time.perf_counter), median of {args.repeats}; a graphed step includes "
          "copying the batch into the graph's static inputs and reading the loss back.")
    print(f"graphs: tinyformer's GraphedStep (tinyformer train --cuda-graphs on), primed by {PRIMING_STEPS} untimed "
          "steps (the eager one of a new shape and the capture); eager: the same step without graphs.")
    if args.vs_torch:
        print(f"torch graphs: PyTorch's whole-network capture (torch.cuda.graph after "
              f"{TorchGraphedRunner.WARMUP_STEPS} side-stream warm-up steps, Adam(capturable=True"
              + (", fused=True" if args.precision == "fp16" else "") + "), static inputs); torch eager: as without "
              "--cuda-graphs. Ratios: tinyformer graphs median / that median (below 1: tinyformer faster).")
    print("launches/step: kernel nodes of tinyformer's captured graph, child graphs included, as the CUDA driver "
          "counts them (backend.graph_nodes; benchmarks/launch_count.py lists them by family)"
          + ("; torch eager launches/step: CUDA kernels of one eager PyTorch step seen by torch.profiler "
             "(activities CUDA; memory copies and sets not counted), n/a without the profiler" if args.vs_torch
             else "") + ".")
    print("graph pool MB: the private memory pool of tinyformer's graphs (GraphedStep.pool_bytes()).")
    for line in notes + graphs_notes(results, args.vs_torch, args.precision):
        print(line)
