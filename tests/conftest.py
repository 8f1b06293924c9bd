"""Hypothesis profiles (random examples on a developer's machine, a fixed set in CI) and shared fixtures."""

import os

import pytest
from hypothesis import settings

from tinyformer import backend

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def set_threads():
    """``set_threads(n)`` sets tinyformer's row-block thread count; the test's end restores it."""
    old = backend.set_num_threads(None)
    backend.set_num_threads(old)
    yield backend.set_num_threads
    backend.set_num_threads(old)
