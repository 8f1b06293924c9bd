"""Whether this test run is CI's: ``.ci/run`` exports ``TINYFORMER_CI=1`` (and many CI services set
``CI``). In CI a test whose machinery is missing (a C++ compiler, NVRTC, torch, Multi30k, Chromium)
fails instead of skipping: CI installs all of it, so a skip there would hide a check that never ran."""

import os

CI_VARIABLE = "TINYFORMER_CI"
CI_VARIABLES = (CI_VARIABLE, "CI")  # a child test run that must not count as CI removes both


def ci_setting(environ=None):
    """The first of ``TINYFORMER_CI`` and ``CI`` set to anything but "", "0" or "false", or None."""
    environ = os.environ if environ is None else environ
    return next((name for name in CI_VARIABLES if environ.get(name, "").lower() not in ("", "0", "false")), None)


def in_ci(environ=None):
    """Whether ``TINYFORMER_CI`` or ``CI`` says this run is CI's."""
    return ci_setting(environ) is not None
