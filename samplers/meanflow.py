"""MeanFlow: few-step sampling with an average velocity ``u(x, r, t)``, and the velocity it induces.

``u(x_t, r, t)`` is the average velocity over ``[r, t]`` along the flow, so
``x_r = x_t - (t - r) u``. The MeanFlow identity ties it to the
instantaneous velocity ``v``: ``v(x_t, t) = u + (t - r) d/dt u(x_t, r, t)``,
with ``d/dt`` the total derivative along the trajectory (``dx/dt = v``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from samplers.rollout import AverageVelocityFn, Rollout

INDUCED_METHODS = ("jvp", "central")


def interval_pairs(
    first: torch.Tensor, second: torch.Tensor, kind: torch.Tensor, equal_share: float, zero_share: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """MeanFlow's ``(t, r)`` from two time draws and a ``U(0, 1)`` draw ``kind`` per row.

    ``t = max(first, second)``, ``r = min(first, second)``; then ``r = t``
    where ``kind < equal_share`` (plain flow matching) and ``r = 0`` where
    ``equal_share <= kind < equal_share + zero_share`` (one-step jumps).
    """
    t, r = torch.maximum(first, second), torch.minimum(first, second)
    r = torch.where(kind < equal_share, t, r)
    zero = (kind >= equal_share) & (kind < equal_share + zero_share)
    return t, torch.where(zero, torch.zeros_like(r), r)


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


def _column(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def induced_velocity(
    average_velocity: AverageVelocityFn,
    x: torch.Tensor,
    r: torch.Tensor,
    t: torch.Tensor,
    cond: Any,
    direction: torch.Tensor,
    method: str = "jvp",
    step: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(V, u)`` with ``V = u(x, r, t) + (t - r) sg(du/dt)``, ``du/dt = d_x u . direction + d_t u``.

    The derivative term is a target-side quantity and carries no gradient (``sg``, as in MeanFlow's own
    loss): ``direction`` is usually the regression target itself (``eps - x0``), and a gradient through
    ``du/dt`` along it would pull the model off the exact MeanFlow solution, where the flow-matching loss
    on ``V`` must be stationary. Gradients reach the parameters through ``u`` alone.

    ``direction`` is ``dx/dt`` along the path (``eps - x0`` on the straight
    interpolant). ``method="jvp"``: exact, by forward-mode differentiation
    (``torch.func.jvp``; ``V`` keeps the graph of ``u``'s parameters through ``u``); fused
    attention kernels have no forward-mode rule on CPU, so attention runs on
    PyTorch's math backend inside it. ``"central"``: ``[u(x + h d, r, t + h) -
    u(x - h d, r, t - h)] / 2h`` without gradient (second-order accurate), the
    cheap option when the derivative is taken once on a frozen model and shared.
    """
    if method not in INDUCED_METHODS:
        raise ValueError(f"unknown method {method!r}; allowed: {INDUCED_METHODS}")
    if method == "jvp":
        with sdpa_kernel([SDPBackend.MATH]):
            u, derivative = torch.func.jvp(
                lambda x_, t_: average_velocity(x_, r, t_, cond), (x, t), (direction, torch.ones_like(t))
            )
    else:
        u = average_velocity(x, r, t, cond)
        with torch.no_grad():
            forward = average_velocity(x + step * direction, r, t + step, cond)
            backward = average_velocity(x - step * direction, r, t - step, cond)
            derivative = (forward - backward) / (2 * step)
    return u + _column(t - r, u) * derivative.detach(), u
