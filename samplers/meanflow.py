"""Few-step sampling with a MeanFlow average velocity ``u(x, r, t)``."""

from __future__ import annotations

from typing import Any

import torch

from samplers.rollout import AverageVelocityFn, Rollout


@torch.no_grad()
def meanflow_sample(
    average_velocity: AverageVelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any = None,
    keep_latents: bool = False,
) -> Rollout:
    """``x_r = x_t - (t - r) u(x_t, r, t)`` over consecutive grid times ``t > r`` (MeanFlow uses 1-4 steps).

    ``u`` is the average velocity over ``[r, t]``, so one step is exact for a
    perfect model; each step is one network evaluation.
    """
    states = [noise]
    for t, r in zip(timesteps[:-1], timesteps[1:]):
        x = states[-1]
        batch = x.shape[0]
        u = average_velocity(x, r.to(x.device).expand(batch), t.to(x.device).expand(batch), cond)
        states.append(x - (t - r).to(x.dtype) * u)
        if not keep_latents:
            states = states[-1:]
    latents = torch.stack(states, dim=1) if keep_latents else None
    return Rollout(x0=states[-1], timesteps=timesteps, nfe=len(timesteps) - 1, latents=latents)
