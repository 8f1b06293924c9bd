"""tinyformer's version: one home, read by the package, the command line and the ranks' code check."""

__version__ = "0.1.0"
