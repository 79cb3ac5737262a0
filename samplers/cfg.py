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
    Extra keyword tensors (per row, e.g. a MeanFlow interval start ``r``) are
    passed through, doubled like ``t``.
    """
    if guidance_scale == 1.0:
        return velocity

    def guided(x: torch.Tensor, t: torch.Tensor, cond: Any, **extra: torch.Tensor) -> torch.Tensor:
        doubled = {key: torch.cat([value, value]) if value.ndim else value for key, value in extra.items()}
        v_cond, v_uncond = velocity(
            torch.cat([x, x]),
            torch.cat([t, t]) if t.ndim else t,
            concat_rows(cond, broadcast_rows(unconditional, x.shape[0])),
            **doubled,
        ).chunk(2)
        return v_uncond + guidance_scale * (v_cond - v_uncond)

    return guided


def guided_average_velocity(
    average_velocity: AverageVelocityFn, guidance_scale: float, unconditional: Any
) -> AverageVelocityFn:
    """The guided MeanFlow average velocity ``u_u + w (u_c - u_u)`` (one batched call, ``w = 1``: unchanged)."""
    if guidance_scale == 1.0:
        return average_velocity
    guided = guided_velocity(
        lambda x, t, cond, r: average_velocity(x, r, t, cond), guidance_scale, unconditional
    )
    return lambda x, r, t, cond: guided(x, t, cond, r=r)
