"""common/blas_spin.py: OpenBLAS's idle threads sleep at once, set before NumPy loads OpenBLAS."""

from children import PYTHON, run
from tinyformer.common import blas_spin

PROBE = ("import os, sys; {first}import tinyformer; "
         "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT', 'unset'))")


def probe(first="", **environ):
    done = run([PYTHON, "-c", PROBE.format(first=first)], env={"OPENBLAS_THREAD_TIMEOUT": None} | environ,
               timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_tinyformer_first_sets_the_quick_sleep():
    assert probe() == blas_spin.QUICK_SLEEP == "4"


def test_a_value_the_user_set_is_left_alone():
    assert probe(OPENBLAS_THREAD_TIMEOUT="12") == "12"


def test_after_numpy_was_loaded_nothing_is_set():
    """OpenBLAS has read the variable by then: setting it would only mislead."""
    assert probe(first="import numpy; ") == "unset"


def test_set_quick_sleep_decides_by_the_environment_and_the_loaded_modules():
    environ = {}
    assert blas_spin.set_quick_sleep(environ, modules={}) and environ == {"OPENBLAS_THREAD_TIMEOUT": "4"}
    assert not blas_spin.set_quick_sleep({"OPENBLAS_THREAD_TIMEOUT": "28"}, modules={})
    environ = {}
    assert not blas_spin.set_quick_sleep(environ, modules={"numpy": object()}) and environ == {}


def test_numpy_sees_the_setting_in_a_fresh_process():
    """The variable reaches the OpenBLAS NumPy loads: threadpoolctl names the library it loaded, and
    the process that imported tinyformer first runs with the value in its environment."""
    code = ("import tinyformer, os, numpy; from threadpoolctl import threadpool_info; "
            "libs = [i['internal_api'] for i in threadpool_info() if i['user_api'] == 'blas']; "
            "print(os.environ['OPENBLAS_THREAD_TIMEOUT'], libs)")
    done = run([PYTHON, "-c", code], env={"OPENBLAS_THREAD_TIMEOUT": None}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("4 ") and "openblas" in done.stdout
