"""Whether operations are recorded for backward: ``no_grad``, ``enable_grad``, ``is_grad_enabled``.

``Function.apply`` asks ``is_grad_enabled()`` before recording a call; inside ``no_grad`` nothing
is recorded (outputs do not require grad and save nothing for backward).
"""

import functools

__all__ = ["no_grad", "enable_grad", "is_grad_enabled"]


class GradMode:
    """The switch itself; ``Function.apply`` reads ``GradMode.enabled`` directly (one lookup per op)."""

    enabled = True


def is_grad_enabled():
    return GradMode.enabled


class _SetGradMode:
    """Context manager and decorator that sets whether operations are recorded."""

    _value = True

    def __new__(cls, func=None):
        self = super().__new__(cls)
        return self(func) if callable(func) else self  # bare @no_grad as well as @no_grad()

    def __init__(self, func=None):
        pass

    def __enter__(self):
        self._previous = GradMode.enabled
        GradMode.enabled = self._value
        return self

    def __exit__(self, *exc_info):
        GradMode.enabled = self._previous
        return False

    def __call__(self, func):
        mode = type(self)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with mode():
                return func(*args, **kwargs)

        return wrapper


class no_grad(_SetGradMode):
    """Record nothing inside: outputs do not require grad and save nothing for backward.

    Use as ``with tinyformer.no_grad(): ...`` or as a decorator, ``@tinyformer.no_grad``
    or ``@tinyformer.no_grad()``.
    """

    _value = False


class enable_grad(_SetGradMode):
    """Record operations again, e.g. inside a ``no_grad`` block."""

    _value = True
