"""ODE samplers of the flow ``dx/dt = v(x, t)``, integrated from t = 1 (noise) to t = 0."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: ``v(x, t, cond)``: velocity at states ``x`` ``[B, ...]`` and times ``t`` ``[B]`` under conditioning ``cond``.
VelocityFn = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]


@torch.no_grad()
def euler(
    velocity: VelocityFn, noise: torch.Tensor, timesteps: torch.Tensor, cond: Any = None
) -> torch.Tensor:
    """Explicit Euler: ``x_{i+1} = x_i + (t_{i+1} - t_i) v(x_i, t_i)``; returns the final sample."""
    x = noise
    for t, t_next in zip(timesteps[:-1], timesteps[1:]):
        x = x + (t_next - t).to(x.dtype) * velocity(x, t.to(x.device).expand(x.shape[0]), cond)
    return x
