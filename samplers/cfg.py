"""Classifier-free guidance as a wrapper of a velocity function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from samplers.ode import VelocityFn


def guided_velocity(
    velocity: VelocityFn,
    guidance_scale: float,
    concat_conditions: Callable[[Any, Any], Any],
    unconditional: Any,
) -> VelocityFn:
    """``v = v_u + w (v_c - v_u)`` with both branches in one batched call; ``w = 1`` returns ``velocity`` itself.

    ``concat_conditions(cond, unconditional)`` must build the conditioning of the
    doubled batch ``[cond; unconditional]`` (the sampler keeps ``cond`` opaque).
    """
    if guidance_scale == 1.0:
        return velocity

    def guided(x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        doubled_t = torch.cat([t, t]) if t.ndim else t
        v_cond, v_uncond = velocity(
            torch.cat([x, x]), doubled_t, concat_conditions(cond, unconditional)
        ).chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    return guided
