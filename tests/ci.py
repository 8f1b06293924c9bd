"""Whether this test run is CI's: ``.ci/run`` exports ``TINYFORMER_CI=1`` (and many CI services set
``CI``). In CI a test whose machinery is missing (a C++ compiler, NVRTC, torch, Multi30k, Chromium)
fails instead of skipping: CI installs all of it, so a skip there would hide a check that never ran."""

import os

CI_VARIABLE = "TINYFORMER_CI"


def in_ci(environ=None):
    """``TINYFORMER_CI`` or ``CI`` set to anything but "", "0" or "false"."""
    environ = os.environ if environ is None else environ
    return any(environ.get(name, "").lower() not in ("", "0", "false") for name in (CI_VARIABLE, "CI"))
