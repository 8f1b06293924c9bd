"""Hypothesis profiles, the process state every test starts from, and shared fixtures (among them
the trained models of ``trained_models``, built once per test run).

Profiles: random examples on a developer's machine (``dev``), a fixed set in CI (``ci``), and
``thorough`` (``python benchmarks/fuzz_thorough.py``, which runs ``python -m pytest -m hypothesis
--hypothesis-profile=thorough`` and counts the examples), which runs every property and fuzz test
with ten times its usual number of examples and no deadline.
"""

import os
import signal
import subprocess
import threading
from pathlib import Path

import background_builds
import children
import compilers
import devices
import pytest
import trained_models
from ci import in_ci
from hypothesis import is_hypothesis_test, settings

import tinyformer.testing  # noqa: F401  installs the kernels' CPU emulation: kernels launch on NumPy arrays
from tinyformer.engine import backend

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
THOROUGH_FACTOR = 10
settings.register_profile("thorough", max_examples=THOROUGH_FACTOR * settings.default.max_examples, deadline=None,
                          print_blob=True)
settings.load_profile("ci" if in_ci() else "dev")  # --hypothesis-profile=NAME overrides this

# Settings of the test run itself that a test may read; all other TINYFORMER_* variables
# (TINYFORMER_KERNELS, TINYFORMER_DEBUG, ...) are removed for each test, which sets what it needs.
KEPT_SETTINGS = ("TINYFORMER_DATA", "TINYFORMER_EMULATION_SANITIZE", compilers.CI_VARIABLE)
THREAD_LIMITS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One pytest-xdist worker per core already keeps every core busy: BLAS threads of its own
    # would only compete with the other workers (and spin while waiting for work), for the small
    # products of the tests' models. A test that sets a count (train.blas_threads) still gets it.
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


@pytest.fixture(autouse=True)
def known_process_state(monkeypatch):
    """Each test starts from the same state whatever the test run inherited: no TINYFORMER_*
    variable but KEPT_SETTINGS, no thread limits in the environment (BLAS, already loaded, keeps
    its pool), umask 022, and Python's own SIGINT handler (KeyboardInterrupt), even when the run
    was started with SIGINT ignored (nohup, a background job); all are restored afterwards.
    Children are started through tests/children.py, which sets their state explicitly."""
    for name in list(os.environ):
        if (name.startswith("TINYFORMER_") and name not in KEPT_SETTINGS) or name in THREAD_LIMITS:
            monkeypatch.delenv(name)
    umask = os.umask(0o022)
    sigint = None
    if threading.current_thread() is threading.main_thread():
        sigint = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        os.umask(umask)
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)


_BACKGROUND = []


@pytest.hookimpl(trylast=True)  # after the tmp_path plugin has set up the run's temporary directory
def pytest_configure(config):
    """A run of the whole suite (no paths given) starts tests/background_builds.py in the
    controlling process, so the kernel builds run beside the first tests (with pytest-xdist, the
    workers' tests); a run of chosen files builds what it needs when it needs it."""
    whole_suite = config.args_source == pytest.Config.ArgsSource.TESTPATHS
    if whole_suite and not hasattr(config, "workerinput") and os.environ.get("TINYFORMER_BACKGROUND_BUILDS") != "0":
        script = Path(__file__).with_name("background_builds.py")
        shared = config._tmp_path_factory.getbasetemp()  # the workers' own lie below it (pytest-xdist)
        data = {"TINYFORMER_DATA": os.environ.get("TINYFORMER_DATA")}
        for part in background_builds.PARTS:
            _BACKGROUND.append(children.start([children.PYTHON, script, shared, part], env=data,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def pytest_unconfigure(config):
    """The background build is done long before the run ends; if not (a run stopped early), stop it."""
    while _BACKGROUND:
        children.stop(_BACKGROUND.pop())


def pytest_collection_modifyitems(items):
    """The tests that need a product of the background build run after all the others, in the
    order the products are ready (``background_builds.WAITING``); pytest-xdist hands tests out in
    this order. Under the thorough profile, a hypothesis test whose ``@settings`` names its own
    number of examples runs THOROUGH_FACTOR times that many (the others already get the profile's
    count)."""
    items.sort(key=background_builds.waiting_rank)  # stable: the files' order otherwise
    if settings.get_current_profile_name() != "thorough":
        return
    scaled = set()
    for item in items:
        test = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if not is_hypothesis_test(test) or id(test) in scaled:
            continue
        scaled.add(id(test))
        # Hypothesis keeps a test's settings in this attribute (set by @settings and @given); a
        # profile cannot raise an explicit max_examples, so a scaled copy replaces them here.
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if not isinstance(own, settings):
            raise pytest.UsageError(f"thorough profile: no hypothesis settings found on {item.nodeid}; "
                                    "has hypothesis changed where it keeps them?")
        if own.max_examples != settings.default.max_examples:
            test._hypothesis_internal_use_settings = settings(own, max_examples=own.max_examples * THOROUGH_FACTOR,
                                                              deadline=None)


@pytest.fixture
def set_threads():
    """``set_threads(n)`` sets tinyformer's row-block thread count; the test's end restores it."""
    old = backend.set_num_threads(None)
    backend.set_num_threads(old)
    yield backend.set_num_threads
    backend.set_num_threads(old)


@pytest.fixture
def emulated_kernels(request, monkeypatch):
    """The ``emulated`` device (``devices``): NumPy arrays take the kernel path, so that functional's
    fused ops and Adam run the CUDA kernels through their CPU emulation. Parametrised indirectly
    with ``(owner, "method")``, only while that method runs (``devices.take_the_kernel_path``)."""
    return devices.take_the_kernel_path(monkeypatch, getattr(request, "param", None))


@pytest.fixture
def cxx_compiler():
    """The C++ compiler of the CPU emulation's tests: skipped without one, failed in CI (``compilers``)."""
    return compilers.require()


@pytest.fixture(scope="session")
def trained_synthetic(tmp_path_factory):
    """The built-in task's `tiny`, trained until it translates (``trained_models.SYNTHETIC``), once
    per test run: a read-only ``trained_models.TrainedRun``."""
    return trained_models.trained_once(tmp_path_factory, "synthetic", trained_models.SYNTHETIC)


@pytest.fixture(scope="session")
def trained_multi30k(tmp_path_factory):
    """A `tiny` trained a few dozen steps on Multi30k (``trained_models.MULTI30K``), once per test
    run; skipped without the data."""
    trained_models.multi30k_or_skip()
    return trained_models.trained_once(tmp_path_factory, "multi30k", trained_models.MULTI30K)
