"""``tinyformer info``: the versions, the device, and which kernel path each op takes there and why
(``kernels.paths``) — the first thing to paste into a question. ``--capability sm_75`` shows the
paths another GPU would take (a T4's, here), without one."""

import sys

import numpy

from ..common.version import __version__
from ..engine import backend
from ..engine.kernels import paths, registry, toolchain

PRECISIONS = ("fp32", "fp16", "bf16")


def register(commands):
    info = commands.add_parser("info", help="versions, the GPU, and the kernel path of each op there")
    info.add_argument("--capability", metavar="SM",
                      help="show the kernel paths of a GPU of this compute capability (sm_75, 8.6) instead of "
                           "this machine's")
    info.set_defaults(run=run)


def run(args):
    capability = None
    if args.capability is not None:
        try:
            capability = f"sm_{backend.capability_number(args.capability, '--capability')}"
        except ValueError as error:
            print(f"tinyformer info: error: {error}", file=sys.stderr)
            return 2
    print(f"tinyformer {__version__}, numpy {numpy.__version__}")
    facts = backend.device_facts()
    cupy = f"CuPy {facts['cupy']}" if facts["cupy"] else "CuPy not installed (the 'gpu' extra)"
    cuda = (f", CUDA runtime {facts['cuda_runtime']}, driver {facts['cuda_driver']}" if facts["cuda_runtime"]
            else "")
    print(cupy + cuda)
    print(f"GPU available (cupy.is_available()): {backend.is_gpu_available()}")
    if facts["name"]:
        used = backend.compute_capability()
        cap = f" (capped to {used} by ${backend.MAX_CAPABILITY})" if used != facts["capability"] else ""
        print(f"device: {facts['name']}, compute capability {_dotted(facts['capability'])} "
              f"({facts['capability']}){cap}, memory {facts['memory_total'] / 2 ** 30:.1f} GiB "
              f"({facts['memory_free'] / 2 ** 30:.1f} GiB free)")
    switch = "on" if paths.kernels_switched_on() else "off (TINYFORMER_KERNELS=0)"
    print(f"CUDA kernels: {switch} for CuPy arrays; NVRTC for compile checks: {toolchain.find_nvrtc() or 'not installed'}")
    shown = capability or backend.compute_capability()
    if shown is None:
        print("kernel paths: no GPU, every op runs its NumPy reference on the CPU (fp32, fp16 and bf16 alike); "
              "tinyformer info --capability sm_75 shows a T4's")
        return 0
    _print_paths(shown, "" if capability is None else " (asked with --capability)")
    return 0


def _dotted(arch):
    number = backend.capability_number(arch)
    return f"{number // 10}.{number % 10}"


def _print_paths(capability, note):
    on = paths.kernels_switched_on()
    print(f"kernel paths on {capability}{note}, per precision (--precision):")
    refused = paths.precision_problem(capability, "bf16")
    for precision in PRECISIONS:
        path = paths.attention_path(capability, paths.PRECISION_DTYPES[precision], 64, kernels_on=on)
        source = f" ({path.source})" if path.source else ""
        print(f"  attention {precision}: {path.name}{source}: {path.reason if path.name != 'refused' else ''}"
              .rstrip(": "))
    print(f"    (head size {', '.join(map(str, registry.HEAD_DIMS))} with no mask or a key-length one; "
          "other head sizes and masks: the NumPy reference, on the GPU)")
    for op in paths.OPS:
        taken = [paths.op_path(op, capability, paths.PRECISION_DTYPES[p], kernels_on=on) for p in PRECISIONS]
        words = ", ".join(f"{p} {t.name}" for p, t in zip(PRECISIONS, taken))
        why = next((t.reason for t in taken if t.name not in ("CUDA cores", "refused")), paths.OPS[op])
        print(f"  {op}: {words} ({why})")
    print("  matrix products: cuBLAS in every precision (kernels/cublas.py)")
    if refused:
        print(f"  bf16 refused: {refused}")
