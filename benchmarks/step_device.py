"""The device side of the step benchmark: waiting for the GPU, and the memory one step takes,
measured the same way for tinyformer and PyTorch (the RSS on the CPU, the memory pools on a GPU)."""

import contextlib
import ctypes
import gc
import sys
import tracemalloc


def synchronize(device):
    """Wait for CuPy's (and, where imported, PyTorch's) queued GPU work; nothing on the CPU."""
    if device == "cuda":
        import cupy

        cupy.cuda.Device().synchronize()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.synchronize()


def loss_value(loss, device):
    """``loss`` (a one-element tensor of either framework) as a float, once ``device`` has finished the step."""
    value = loss.item()
    synchronize(device)
    return value


@contextlib.contextmanager
def in_eval_mode(model):
    """``model`` (a module of either framework) in eval mode for the block, in training mode after it."""
    model.eval()
    try:
        yield
    finally:
        model.train()


def _read_status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError(f"{field} not in /proc/self/status")


def rss_probe_available():
    """Linux only: resettable peak RSS (/proc/self/clear_refs, Linux >= 4.0) and glibc's malloc_trim."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _read_status("VmHWM")
        ctypes.CDLL(None).malloc_trim
        return True
    except (OSError, AttributeError):
        return False


def rss_growth(step):
    """Peak resident set during ``step()`` minus the resident set just before it, in bytes.

    Freed heap pages are first handed back to the OS (``malloc_trim``) so that memory reused from
    earlier steps is counted again; then the kernel's high-water mark is reset and read after the
    step. Works alike for NumPy and PyTorch (whose CPU tensors come from malloc too).
    """
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _read_status("VmRSS")
    step()
    return _read_status("VmHWM") - before


def traced_peak(step):
    """Peak of the bytes allocated during ``step()`` and still live, as tracemalloc sees them."""
    gc.collect()
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def cupy_pool_growth(step):
    """Bytes CuPy's default memory pool grows to during ``step()`` above what was in use before it."""
    import cupy

    pool = cupy.get_default_memory_pool()
    synchronize("cuda")
    pool.free_all_blocks()
    before = pool.used_bytes()
    step()
    synchronize("cuda")
    return pool.total_bytes() - before


def torch_cuda_growth(step):
    """Peak bytes PyTorch's CUDA allocator holds during ``step()`` above what it held before it."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before
