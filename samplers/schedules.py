"""Timestep schedules for flow-matching samplers (t = 1 is noise, t = 0 is data)."""

from __future__ import annotations

import torch


def shift_time(t: torch.Tensor, shift: float) -> torch.Tensor:
    """SD3 time shift ``t' = s t / (1 + (s - 1) t)``; ``s = 1`` is the identity."""
    if shift <= 0:
        raise ValueError(f"time shift must be > 0, got {shift}")
    return shift * t / (1 + (shift - 1) * t)


def timesteps(num_steps: int, shift: float = 1.0, t_max: float = 1.0, t_min: float = 0.0) -> torch.Tensor:
    """``num_steps + 1`` decreasing times from ``t_max`` to ``t_min``, uniform then shifted, float32.

    ``t_max < 1`` or ``t_min > 0`` truncate the schedule (the shift applies after truncation).
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if not 0.0 <= t_min < t_max <= 1.0:
        raise ValueError(f"need 0 <= t_min < t_max <= 1, got t_min={t_min}, t_max={t_max}")
    return shift_time(torch.linspace(t_max, t_min, num_steps + 1, dtype=torch.float32), shift)
