"""Optimisers, learning-rate schedules (§5.3) and loss scaling for float16 training."""

from .adam import Adam, clip_grad_norm
from .grad_scaler import GradScaler, LossScaleTooSmall
from .schedules import NoamSchedule, TimeBudgetSchedule

__all__ = ["Adam", "GradScaler", "LossScaleTooSmall", "NoamSchedule", "TimeBudgetSchedule",
           "clip_grad_norm"]
