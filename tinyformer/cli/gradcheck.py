"""``tinyformer gradcheck``: every fused op and layer's backward (and every CUDA kernel) checked."""

import time

from ..engine import backend
from .usage import UsageError


def register(commands):
    check = commands.add_parser(
        "gradcheck", help="gradient-check every fused op and layer (and, on cuda, every kernel)",
        description="Check each fused op and layer's backward against central differences on random "
                    "float64 inputs, one row each; exit status 1 if any fails. With --device cuda the "
                    "checks run on CuPy arrays and every CUDA kernel is also compared with its NumPy "
                    "reference (kernel_* rows).")
    check.add_argument("--layer", default="all", metavar="NAME",
                       help="a case name, a comma-separated list, or all (default); an unknown name "
                            "lists the valid ones. kernel_* names on --device cpu run the kernel source "
                            "through the C++ emulation (needs g++)")
    check.add_argument("--mode", default="full", choices=("full", "fast"),
                       help="full: every element by central differences (default); fast: one random "
                            "direction per input")
    check.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="cpu (default) or cuda")
    check.set_defaults(run=run)


def run(args):
    from ..testing import gradcheck_suite as suite  # the one command whose work is the verification room's

    if args.device == "cuda" and not backend.is_gpu_available():
        raise UsageError("--device cuda: no usable GPU (cupy.is_available() is false); install the 'gpu' "
                         "extra on a machine with a CUDA driver, or use --device cpu")
    valid = ["all", *suite.CASES, *suite.KERNEL_CASES]
    selected = []
    for name in (part.strip() for part in args.layer.split(",")):
        if name not in valid:
            raise UsageError(f"unknown --layer {name!r}; valid names: {', '.join(valid)}")
        selected += suite.names(args.device) if name == "all" else [name]
    print(f"gradcheck: mode {args.mode}, device {args.device}; {suite.TOLERANCE_NOTE}")
    start = time.perf_counter()
    rows = suite.run(dict.fromkeys(selected), args.mode, args.device)
    print(suite.format_table(rows))
    if any(r.name in suite.KERNEL_CASES for r in rows):
        print(suite.KERNEL_TOLERANCE_NOTE)
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed} passed, {failed} failed in {time.perf_counter() - start:.1f} s")
    return 1 if failed else 0
