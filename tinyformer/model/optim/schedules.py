"""The learning-rate schedule of §5.3: linear warm-up, then decay with 1/√step."""

from ...common.validation import check_int, check_real

__all__ = ["NoamSchedule"]


class NoamSchedule:
    """lr(step) = factor · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5).

    Rises linearly for ``warmup_steps`` steps, peaks at step ``warmup_steps``
    (6.99e-4 for d_model 512, warm-up 4000), then falls as 1/√step. Steps count from 1.
    """

    def __init__(self, d_model, warmup_steps=4000, factor=1.0):
        self.d_model = check_int("NoamSchedule: d_model", d_model, 1)
        self.warmup_steps = check_int("NoamSchedule: warmup_steps", warmup_steps, 1)
        self.factor = check_real("NoamSchedule: factor", factor, 0, open_minimum=True)

    def __call__(self, step):
        if step < 1:
            raise ValueError(f"NoamSchedule: steps count from 1, got {step}")
        return self.factor * self.d_model ** -0.5 * min(step ** -0.5, step * self.warmup_steps ** -1.5)

    def peak(self):
        """(step, lr) at the top of the warm-up."""
        return self.warmup_steps, self(self.warmup_steps)

    def state_dict(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "factor": self.factor}

    def load_state_dict(self, state):
        self.__init__(state["d_model"], state["warmup_steps"], state["factor"])
        return self

    def __repr__(self):
        return f"NoamSchedule(d_model={self.d_model}, warmup_steps={self.warmup_steps}, factor={self.factor})"
