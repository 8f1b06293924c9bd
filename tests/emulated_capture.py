"""The CUDA graph capture emulated on NumPy arrays, for the tests: it lives in the library's
verification room, ``tinyformer.testing.emulated_capture`` (benchmarks/launch_count.py uses it too)."""

from tinyformer.testing.emulated_capture import DeviceArray, EmulatedCapture, installed  # noqa: F401
