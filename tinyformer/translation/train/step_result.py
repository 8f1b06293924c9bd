"""What one training step did, whichever way it ran: eagerly (``Trainer.train_step``) or replayed
as a captured CUDA graph (``graphs.GraphedStep``, with ``cuda_graphs="on"``)."""

import dataclasses

__all__ = ["StepResult"]


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One optimiser step over a step's batches (all ranks' together)."""

    loss: float              # the label-smoothed loss per target token
    nll: float               # the negative log-likelihood per target token
    tokens: int              # the target tokens of the step's batches
    grad_norm: float = None  # the unscaled global gradient norm; None when the loss was not finite
    applied: bool = False    # the update was applied (the position's step moved on); else it was skipped
    overflowed: bool = False   # fp16: skipped because the scaled gradients overflowed (the scale backed off)
    interrupted: bool = False  # several ranks: some rank had a Ctrl-C by this step (agreed in its collective)
    time_up: bool = False      # rank 0's clock passed time_limit's deadline by this step (agreed likewise)
    seconds: float = 0.0       # the run's training seconds by this step, on rank 0's clock (agreed likewise)
