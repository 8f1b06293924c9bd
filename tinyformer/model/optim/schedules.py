"""Learning-rate schedules: §5.3's (linear warm-up, then decay with 1/√step), and one that ends
with a time budget (linear warm-up, a plateau, then linear decay to 0 when the time is up)."""

from ...common.validation import check_int, check_real

__all__ = ["NoamSchedule", "TimeBudgetSchedule"]


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


class TimeBudgetSchedule:
    """lr(step) = peak · min(step / warmup_steps, 1) · min(1, (1 − t) / decay_fraction), with the
    Noam peak = factor · d_model^-0.5 · warmup_steps^-0.5 and t the elapsed fraction of the time
    budget, clipped to [0, 1].

    Rises linearly for ``warmup_steps`` steps to the peak NoamSchedule reaches there, stays there
    until a fraction 1 − ``decay_fraction`` of the time has passed, then falls linearly to 0 at the
    end of the budget (``decay_fraction`` 1: it falls from the start, under the warm-up). t is no
    function of the step: whoever owns the clock sets ``elapsed_fraction`` before each update (the
    Trainer does, from the seconds every rank agreed on). It is not part of the state: a resumed
    run sets it from its own clock. Steps count from 1.
    """

    def __init__(self, d_model, warmup_steps=4000, factor=1.0, decay_fraction=1.0):
        self.d_model = check_int("TimeBudgetSchedule: d_model", d_model, 1)
        self.warmup_steps = check_int("TimeBudgetSchedule: warmup_steps", warmup_steps, 1)
        self.factor = check_real("TimeBudgetSchedule: factor", factor, 0, open_minimum=True)
        self.decay_fraction = check_real("TimeBudgetSchedule: decay_fraction", decay_fraction, 0, 1,
                                         open_minimum=True)
        self.elapsed_fraction = 0.0

    def peak_lr(self):
        """factor · d_model^-0.5 · warmup_steps^-0.5: NoamSchedule's top."""
        return self.factor * self.d_model ** -0.5 * self.warmup_steps ** -0.5

    def __call__(self, step):
        if step < 1:
            raise ValueError(f"TimeBudgetSchedule: steps count from 1, got {step}")
        left = 1.0 - min(max(float(self.elapsed_fraction), 0.0), 1.0)
        return self.peak_lr() * min(step / self.warmup_steps, 1.0) * min(1.0, left / self.decay_fraction)

    def state_dict(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "factor": self.factor,
                "decay_fraction": self.decay_fraction}

    def load_state_dict(self, state):
        elapsed = self.elapsed_fraction
        self.__init__(state["d_model"], state["warmup_steps"], state["factor"], state.get("decay_fraction", 1.0))
        self.elapsed_fraction = elapsed
        return self

    def __repr__(self):
        return (f"TimeBudgetSchedule(d_model={self.d_model}, warmup_steps={self.warmup_steps}, "
                f"factor={self.factor}, decay_fraction={self.decay_fraction})")
