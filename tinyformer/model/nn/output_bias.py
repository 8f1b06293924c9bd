"""A sublayer's output bias left for the post-LN residual connection to add (F.residual_dropout_layer_norm's
y_bias: no launch of its own either way), only where the sublayer says it left it out."""

from ...engine import functional as F

__all__ = ["LeavesOutputBias", "call_leaving_output_bias"]


class LeavesOutputBias:
    """For a Module whose output is its last Linear's: ``output(linear, x)`` is ``linear(x)``, without
    the bias where ``call_leaving_output_bias`` asked for this call, and then the bias left out is
    recorded for it to take. A forward that never calls ``output`` (a replaced forward, exercise 6 of
    the course) records nothing, so its output is taken as complete."""

    def output(self, linear, x):
        """``linear(x)``; its bias left out (and recorded) when the residual connection asked, once."""
        asked = self.__dict__.pop("_output_bias_asked", False)
        if not asked or linear.bias is None:
            return linear(x)
        self._output_bias_left_out = (linear.bias,)  # a tuple: a Parameter held directly would count as the module's
        return F.linear(x, linear.weight)


def call_leaving_output_bias(module, sublayer, x):
    """(y, bias): y = sublayer(x), where ``module`` (the sublayer's module, or None) may leave its
    output bias out of y; bias is what it said it left out, None where it left nothing out (then y
    is complete). Nothing asked of ``module`` outlives the call."""
    if not isinstance(module, LeavesOutputBias):
        return sublayer(x), None
    module._output_bias_asked = True
    try:
        y = sublayer(x)
    finally:
        module.__dict__.pop("_output_bias_asked", None)
        left_out = module.__dict__.pop("_output_bias_left_out", (None,))
    return y, left_out[0]
