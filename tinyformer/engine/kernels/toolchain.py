"""Where the CUDA pieces live: headers (cuda_fp16.h, cuda_bf16.h) and the NVRTC library.

They come from a CUDA toolkit (``$CUDA_PATH``, ``/usr/local/cuda``) or from NVIDIA's
wheels (``nvidia-cuda-runtime`` for the headers, ``nvidia-cuda-nvrtc`` for the compiler),
which need neither a GPU nor a driver.
"""

import ctypes.util
import glob
import os
import re
import site
import sys
import tempfile
from pathlib import Path

from ...common import filecache


def _toolkit_roots():
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    return [Path(r) for r in roots if r]


def _wheel_roots():
    """nvidia/<component>/ folders of the installed NVIDIA wheels (cu12: one per component; cu13: nvidia/cu13)."""
    bases = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    roots = []
    for base in bases:
        for folder in sorted(glob.glob(os.path.join(base, "nvidia", "*"))):
            if os.path.isdir(folder) and Path(folder) not in roots:
                roots.append(Path(folder))
    return roots


def _cuda_major(root):
    """12 for nvidia/cuda_runtime (the cu12 wheels' layout), 13 for nvidia/cu13, None if unknown."""
    if root.name == "cuda_runtime":
        return 12
    return int(root.name[2:]) if root.name.startswith("cu") and root.name[2:].isdigit() else None


def _toolkit_major(root):
    """A toolkit's CUDA major version, from its cuda.h (``#define CUDA_VERSION 13000``), or None."""
    try:
        text = (root / "include" / "cuda.h").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", text)
    return int(found.group(1)) // 1000 if found else None


def cuda_include_dirs(cuda_major=None):
    """Folders holding cuda_fp16.h, for NVRTC's -I: a toolkit first, then NVIDIA's wheels; with
    ``cuda_major`` (the CUDA version the compiler belongs to), the headers of that version first."""
    roots = [(r, _toolkit_major(r)) for r in _toolkit_roots()] + [(r, _cuda_major(r)) for r in _wheel_roots()]
    roots = [(r, major) for r, major in roots if (r / "include" / "cuda_fp16.h").is_file()]
    if cuda_major is not None:
        roots.sort(key=lambda entry: entry[1] != cuda_major)  # stable: a toolkit still before a wheel
    return [roots[0][0] / "include"] if roots else []


NVRTC_MAJORS = (13, 12)
"""The CUDA versions whose NVRTC wheels tinyformer knows, newest first: nvidia-cuda-nvrtc (13, sm_75
and newer) and nvidia-cuda-nvrtc-cu12 (12, sm_50 to sm_90: the one for sm_70)."""


def _nvrtc_major(path):
    """13 for .../libnvrtc.so.13 (a version suffix names the CUDA), else None."""
    suffix = os.path.basename(path).partition(".so.")[2].split(".")[0]
    return int(suffix) if suffix.isdigit() else None


def find_nvrtc(cuda_major=None):
    """Path of libnvrtc (the newest CUDA's wheel first, then a toolkit, then the system), or None;
    with ``cuda_major``, only one of that CUDA version (12 for sm_70, which CUDA 13 dropped)."""
    candidates = []
    for root in _wheel_roots():
        candidates += sorted(glob.glob(str(root / "lib" / "libnvrtc.so*")), reverse=True)
    for root in _toolkit_roots():
        candidates += sorted(glob.glob(str(root / "lib64" / "libnvrtc.so*")), reverse=True)
    candidates = [c for c in candidates if "builtins" not in c and "alt" not in os.path.basename(c)]
    candidates.sort(key=lambda c: -(_nvrtc_major(c) or 0))  # stable: a toolkit after the wheels of its version
    if cuda_major is not None:
        return next((c for c in candidates if _nvrtc_major(c) == cuda_major), None)
    if candidates:
        return candidates[0]
    return ctypes.util.find_library("nvrtc")


def build_cache():
    """The folder where built kernels are kept between processes (the system's temp folder), made
    on first use; every product in it is named by a hash of everything it was built from."""
    folder = Path(tempfile.gettempdir()) / f"tinyformer-kernels-{os.getuid()}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def cached_product(name, make):
    """The path of ``name`` in the build cache, made by ``make(partial_path)`` if it is not there
    (``filecache.cached_product``: one process makes it, a concurrent one waits and takes it)."""
    return filecache.cached_product(build_cache(), name, make)
