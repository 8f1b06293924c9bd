"""One training step of the Transformer (forward, backward, Adam) at about 4,096 target tokens.

For each preset (default ``small`` and ``base``) builds ``Transformer.from_preset`` with a
shared vocabulary and times whole training steps on one fixed, seeded batch of sentence pairs:

    zero_grad; logits = model(src, tgt_in);
    loss = cross_entropy(logits, tgt_out, label_smoothing=0.1, ignore_index=pad);
    loss.backward(); Adam(betas=(0.9, 0.98), eps=1e-9, lr=NoamSchedule(d_model, 4000)).step()

in training mode (dropout as in the preset). It prints the median and the fastest step time,
tokens/s (target tokens / median) and the peak memory of one step. ``--vs-torch`` builds the same
model in PyTorch (post-LN ``nn.Transformer``, tied embeddings, same batch, same weights), checks
that both give the same loss, and times the two in the same run: interleaved step by step
(default), or ``--order blocks``, each framework's steps back to back as in a real training run.

``--device cuda --cuda-graphs`` (issue 17) times, side by side in one run, tinyformer's step
captured as a CUDA graph (``train.graphs.GraphedStep``, as ``tinyformer train --cuda-graphs on``
runs it) and eager, and with ``--vs-torch`` PyTorch eager and PyTorch's own capture of the same
whole step (``torch.cuda.graph``, static inputs, warm-up on a side stream, ``Adam(capturable=True)``);
it prints the ratios of tinyformer with graphs to both and the kernel launches per step.

    python benchmarks/bench_step.py [--preset small,base] [--tokens 4096] [--vs-torch] [--markdown]
    python benchmarks/bench_step.py --device cuda --cuda-graphs --vs-torch [--precision bf16]

This file is the command line; the parts are its neighbours: ``step_batch.py`` (the batch, with the
package's special ids, and the model FLOPs), ``step_runners.py`` (tinyformer's step, eager and
graphed), ``step_torch.py`` (PyTorch's), ``step_device.py`` (synchronisation and memory),
``step_measure.py`` (the timed steps, the same-model check, the sgemm peak) and ``step_report.py``
(the lines and tables printed).
"""

import argparse
import os
import sys

import tinyformer  # noqa: F401  first: its OpenBLAS setting (common/blas_spin.py) must precede NumPy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/ is not a package
# main's parts; those marked F401 are read through this file by the tests (tests/benchmarks/test_bench_step.py)
from step_batch import make_batch, model_flops  # noqa: E402,F401
from step_device import rss_probe_available  # noqa: E402
from step_measure import PRIMING_STEPS, measure, measure_graphs, sgemm_peak  # noqa: E402,F401
from step_report import (graphs_notes, graphs_table, print_graphs_report, print_peak, print_preamble,  # noqa: E402,F401
                         print_step_report, print_table)
from step_torch import count_kernels  # noqa: E402,F401


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", help="preset name(s), repeatable or comma-separated "
                        "(default: small,base)")
    parser.add_argument("--tokens", type=int, default=4096, help="target tokens per batch (default 4096)")
    parser.add_argument("--length", type=int, default=32, help="padded source/target length (default 32)")
    parser.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size (default 8000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per framework (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--vs-torch", action="store_true", help="time the same model in PyTorch alongside")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's own)")
    parser.add_argument("--order", choices=("interleaved", "blocks"), default="interleaved",
                        help="with --vs-torch: alternate tinyformer and PyTorch steps (default), or run "
                        "all of one framework's steps, then all of the other's")
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="tinyformer.engine.amp's precision; PyTorch under torch.autocast of the same type (default fp32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="with --device cuda: time tinyformer's step captured as a CUDA graph beside its eager "
                        "step (and, with --vs-torch, PyTorch eager and PyTorch's own graph of the whole step), with "
                        "the ratios and kernel launches per step (issue 17)")
    return parser


def parse_args(parser, argv):
    """The arguments, checked: a bad number or a combination the machine cannot run is a one-line usage error."""
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.length < 2 or args.repeats < 1 or args.warmup < 0:
        parser.error("--tokens >= 1, --length >= 2, --repeats >= 1 and --warmup >= 0 are required")
    args.presets = parse_presets(args.preset)

    from tinyformer.engine import backend

    if args.cuda_graphs and (args.device != "cuda" or not backend.is_gpu_available()):
        parser.exit(2, f"{parser.prog}: error: --cuda-graphs " + (
            "needs --device cuda (CUDA graphs capture GPU work)" if args.device != "cuda" else
            "needs CuPy with a usable GPU (tinyformer.engine.backend.is_gpu_available() is false)") + "\n")
    if args.device == "cuda" and not backend.is_gpu_available():
        parser.error("--device cuda needs CuPy with a usable GPU (tinyformer.engine.backend.is_gpu_available())")
    args.rss = args.device == "cpu" and rss_probe_available()
    return args


def parse_presets(values):
    from tinyformer.model.nn.presets import check_preset

    names = [n.strip() for v in (values or ["small,base"]) for n in v.split(",") if n.strip()]
    try:
        return [check_preset(n) for n in names]
    except ValueError as error:
        raise SystemExit(f"--preset: {error}") from None


def import_torch(parser, args):
    """PyTorch with its thread count set, for --vs-torch (None without it); a usage error if missing."""
    if not args.vs_torch:
        return None
    try:
        import torch
    except ImportError:
        parser.error("--vs-torch needs PyTorch (pip install '.[bench]')")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--vs-torch --device cuda needs a CUDA build of PyTorch")
    if args.threads:
        torch.set_num_threads(args.threads)
    return torch


def main(argv=None):
    parser = build_parser()
    args = parse_args(parser, argv)
    torch = import_torch(parser, args)
    batch = make_batch(args.tokens, args.length, args.vocab, args.seed)
    print_preamble(args, batch, torch)
    peak = sgemm_peak() if args.device == "cpu" else None
    print_peak(peak)
    notes = []  # lines the measurements add under the table (the same-model checks)
    if args.cuda_graphs:
        results = [measure_graphs(preset, args, batch, notes) for preset in args.presets]
        print_graphs_report(results, batch, args, notes)
        if any(r["missing"] for r in results):
            sys.exit(f"{parser.prog}: some figures were not measured (see above)")
        return
    results = [measure(preset, args, batch, notes) for preset in args.presets]
    print_step_report(results, batch, args, peak, notes)


if __name__ == "__main__":
    main()
