"""Dynamic loss scaling for float16 training, with PyTorch ``GradScaler``'s defaults.

float16's smallest normal number is 6.1e-5 (subnormals reach 6e-8), so small gradients of a
float16 backward pass vanish. The loss is multiplied by a scale s before the backward pass, the
gradients divided by s before the update (``Adam.step(grad_scale=s)``). s starts high (2¹⁶); a
step whose gradients overflowed (a non-finite norm) is skipped and s halves; after
``growth_interval`` steps in a row without overflow s doubles. bfloat16 has float32's exponent
range and needs none of this.
"""

import math

from ...common.validation import check_int, check_real

__all__ = ["GradScaler", "LossScaleTooSmall"]


class LossScaleTooSmall(FloatingPointError):
    """The loss scale fell below ``min_scale``: the gradients overflow even unscaled, the run diverged."""


class GradScaler:
    """``scale(loss)`` before backward, then ``step(optimizer)``: the update with the gradients
    unscaled, or, on overflow, no update (parameters and moments untouched), the scale times
    ``backoff_factor`` and the step counted in ``skipped_steps``. Below ``min_scale`` ``step``
    raises ``LossScaleTooSmall`` (1e-4 by default, as fairseq's --min-loss-scale).
    ``enabled=False`` (fp32, bf16) makes every call a plain one."""

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 min_scale=1e-4, enabled=True):
        self.scale = check_real("GradScaler: init_scale", init_scale, 0, open_minimum=True)
        self.growth_factor = check_real("GradScaler: growth_factor", growth_factor, 1, open_minimum=True)
        self.backoff_factor = check_real("GradScaler: backoff_factor", backoff_factor, 0, 1, open_minimum=True,
                                         open_maximum=True)
        self.growth_interval = check_int("GradScaler: growth_interval", growth_interval, 1)
        self.min_scale = check_real("GradScaler: min_scale", min_scale, 0, open_minimum=True)
        self.enabled = bool(enabled)
        self.good_steps = 0      # steps without overflow since the scale last changed
        self.skipped_steps = 0   # steps skipped for overflow, in all

    def scale_loss(self, loss):
        """``loss`` times the current scale (``loss`` itself when disabled)."""
        return loss * self.scale if self.enabled else loss

    def step(self, optimizer, skip_nonfinite=True):
        """The optimiser's step on unscaled gradients; returns (gradient norm, whether it was skipped
        for overflow). Disabled: ``optimizer.step(skip_nonfinite)`` and never an overflow."""
        if not self.enabled:
            return optimizer.step(skip_nonfinite=skip_nonfinite), False
        norm = optimizer.step(skip_nonfinite=True, grad_scale=self.scale)
        overflow = not math.isfinite(norm)
        self.update(overflow)
        return norm, overflow

    def update(self, overflow):
        """Back off after an overflow (raising ``LossScaleTooSmall`` below the floor), grow after
        ``growth_interval`` good steps."""
        if overflow:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped_steps += 1
            if self.scale < self.min_scale:
                raise LossScaleTooSmall(
                    f"the fp16 loss scale fell to {self.scale:g}, below its floor {self.min_scale:g}, after "
                    f"{self.skipped_steps} overflowing steps: the gradients overflow float16 even unscaled")
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0

    def state_dict(self):
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "min_scale": self.min_scale, "enabled": self.enabled}

    def load_state_dict(self, state):
        """Continue from ``state_dict()``: scale and counters (the factors stay this scaler's own)."""
        self.scale = float(state["scale"])
        self.good_steps, self.skipped_steps = int(state["good_steps"]), int(state["skipped_steps"])
        return self
