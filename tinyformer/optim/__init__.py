"""Optimisers and learning-rate schedules (§5.3)."""

from .adam import Adam, clip_grad_norm
from .schedules import NoamSchedule

__all__ = ["Adam", "NoamSchedule", "clip_grad_norm"]
