"""``tinyformer info``: the versions and whether a GPU is usable."""

import os

import numpy

from ..common.version import __version__
from ..engine import backend


def register(commands):
    info = commands.add_parser("info", help="versions and whether a GPU is usable")
    info.set_defaults(run=run)


def run(args):
    print(f"tinyformer {__version__}")
    print(f"numpy {numpy.__version__}")
    print(f"GPU available (cupy.is_available()): {backend.is_gpu_available()}")
    from ..engine.kernels import toolchain

    print(f"CUDA kernels: {'on' if os.environ.get('TINYFORMER_KERNELS', '1') != '0' else 'off (TINYFORMER_KERNELS=0)'}"
          f" for CuPy arrays; NVRTC for compile checks: {toolchain.find_nvrtc() or 'not installed'}")
    return 0
