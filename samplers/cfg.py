"""Classifier-free guidance as a wrapper of a velocity function."""

from __future__ import annotations

from typing import Any

import torch

from samplers.conditioning import broadcast_rows, concat_rows
from samplers.rollout import AverageVelocityFn, VelocityFn


def guided_velocity(velocity: VelocityFn, guidance_scale: float, unconditional: Any) -> VelocityFn:
    """``v = v_u + w (v_c - v_u)``, both branches in one batched call of ``velocity``.

    ``unconditional`` is the conditioning of the empty prompt, either with as
    many rows as the ``cond`` the guided function is called with or with one
    row shared by all (what tree samplers need: their frontier grows). ``w = 1``
    is no guidance: ``velocity`` itself is returned, so there is no second forward.
    """
    if guidance_scale == 1.0:
        return velocity

    def guided(x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        doubled_t = torch.cat([t, t]) if t.ndim else t
        v_cond, v_uncond = velocity(
            torch.cat([x, x]), doubled_t, concat_rows(cond, broadcast_rows(unconditional, x.shape[0]))
        ).chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    return guided


def guided_average_velocity(
    average_velocity: AverageVelocityFn, guidance_scale: float, unconditional: Any
) -> AverageVelocityFn:
    """The guided MeanFlow average velocity ``u_u + w (u_c - u_u)`` (one batched call, ``w = 1``: unchanged)."""
    if guidance_scale == 1.0:
        return average_velocity

    def guided(x: torch.Tensor, r: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        doubled_r = torch.cat([r, r]) if r.ndim else r
        velocity = guided_velocity(
            lambda x_, t_, c_: average_velocity(x_, doubled_r, t_, c_), guidance_scale, unconditional
        )
        return velocity(x, t, cond)

    return guided
