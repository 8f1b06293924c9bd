"""Where a fused op's backward adds a parameter's gradient itself (``Function.grad_targets``)."""


def target_array(target, dtype):
    """The array to add a gradient of ``dtype`` into, from an ``autograd.GradTarget`` (or None): the
    target's array where it holds ``dtype`` and is contiguous (what a kernel writes), else None, and
    the gradient is returned to the engine as usual."""
    if target is None:
        return None
    held = target.gathered if target.gathered is not None else target.tensor.grad
    if (target.tensor.dtype if held is None else held.dtype) != dtype:
        return None
    if held is not None and not held.flags.c_contiguous:
        return None
    return target.array()
