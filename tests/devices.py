"""The devices a test runs on, one vocabulary for the suite:

- ``numpy``: NumPy arrays, the reference path of every op;
- ``emulated``: NumPy arrays on the GPU's kernel path (``kernels.on_gpu`` made to answer yes), so
  that each fused op and Adam run the CUDA kernels' own source through their CPU emulation
  (testing/emulation/cpu_emulation.h; conftest's ``emulated_kernels`` fixture);
- ``cuda``: CuPy arrays on a GPU, the compiled kernels; marked ``gpu`` and skipped without a
  usable CuPy device.

A test that holds on several devices is parametrised over them (``parameters``, ``on_cuda``);
one that exists only on the GPU carries ``NEEDS_GPU`` (``needs_gpu``).
"""

import pytest

from tinyformer.engine import backend, kernels

NEEDS_GPU = (pytest.mark.gpu,
             pytest.mark.skipif(not backend.is_gpu_available(), reason="no usable CUDA GPU (cupy.is_available() is false)"))
DEVICES = ("numpy", "emulated", "cuda")


def needs_gpu(test):
    """A test that exists only on the GPU: ``NEEDS_GPU``'s marks."""
    for mark in NEEDS_GPU:
        test = mark(test)
    return test


def parameters(*names):
    """pytest parameters of the devices ``names`` (each its own id; ``cuda`` marked ``NEEDS_GPU``)."""
    unknown = [name for name in names if name not in DEVICES]
    if unknown:
        raise ValueError(f"devices must be among {', '.join(DEVICES)}, got {', '.join(map(repr, unknown))}")
    return [on_cuda(name, id=name) if name == "cuda" else pytest.param(name, id=name) for name in names]


def on_cuda(*values, id=None):
    """A pytest parameter of ``values`` that runs on the GPU (marked ``NEEDS_GPU``)."""
    return pytest.param(*values, marks=NEEDS_GPU, id=id)


def take_the_kernel_path(monkeypatch, inside=None):
    """NumPy arrays take the kernel path: everywhere (``inside=None``), or only while the method
    ``inside = (owner, name)`` runs, nested calls included (a graphed step through the kernels, its
    validation and decoding on the faster NumPy reference). Returns the list of the calls in
    progress (empty outside them)."""
    if inside is None:
        monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: True)
        return [True]
    owner, name = inside
    running = []
    method = getattr(owner, name)

    def on_the_kernel_path(self, *args, **kwargs):
        running.append(True)
        try:
            return method(self, *args, **kwargs)
        finally:
            running.pop()

    monkeypatch.setattr(kernels, "on_gpu", lambda *arrays: bool(running))
    monkeypatch.setattr(owner, name, on_the_kernel_path)
    return running
