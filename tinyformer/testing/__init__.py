"""The verification room (as ``numpy.testing`` and ``chainer.testing``): what checks tinyformer,
shipped with it but used by none of its layers.

* ``kernel_cases``: each CUDA kernel against its NumPy reference (one module per kernel; the
  harness: tolerances, ``Device``, ``Comparison``, ``KernelRun``);
* ``gradcheck_suite``: the cases of ``tinyformer gradcheck``: every fused op and layer by central
  differences (the checker itself is the engine's, ``tinyformer.engine.gradcheck``), and the kernels;
* ``emulation``: the kernels' own sources built as C++ against ``cpu_emulation.h`` and run on the
  CPU, so that CI runs the kernels without a GPU;
* ``compile_check``: CI's NVRTC check of every instantiation for every architecture
  (``python -m tinyformer.testing.compile_check``);
* ``emulated_capture``: a CUDA graph capture emulated on NumPy arrays, for the graphed step's logic
  without a GPU (the tests and ``benchmarks/launch_count.py``);
* ``marian_folders``: small Marian folders written as transformers writes them (the tests and the
  benchmarks that import a model).

It may import every layer; no module of the library imports it, but for two commands that run
its machinery on a user's request: ``tinyformer gradcheck`` (``cli/gradcheck.py`` runs the suite)
and exercise 7's kernel trace (``study/course/flash_kernel.py`` runs attention.cu through the
emulation). tests/project/test_imports.py enforces both.

Importing the package installs the CPU emulation as the engine's host loader
(``emulation.install()``, through ``kernels.launch.install_host_loader``): from then on a kernel
launched on NumPy arrays runs its source on the CPU. The engine's own dispatch still sends NumPy
arrays to the NumPy references (``kernels.use_kernels`` asks for CuPy arrays), so nothing else changes.
"""

from . import emulation

emulation.install()
