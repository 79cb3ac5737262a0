"""ODE samplers of the flow ``dx/dt = v(x, t)``, integrated from t = 1 (noise) to t = 0 (data).

Each takes a velocity function ``v(x, t, cond)``, initial noise, a decreasing
grid of times (``samplers.schedules.timesteps``) and the conditioning, and
returns a :class:`~samplers.rollout.Rollout`. With ``keep_latents`` every
state is kept. No gradients flow: samplers are for rollouts and evaluation.
"""

from __future__ import annotations

from typing import Any

import torch

from samplers.rollout import Rollout, VelocityFn


def _times(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return t.to(x.device).expand(x.shape[0])


def _rollout(states: list[torch.Tensor], timesteps: torch.Tensor, nfe: int, keep_latents: bool) -> Rollout:
    latents = torch.stack(states, dim=1) if keep_latents else None
    return Rollout(x0=states[-1], timesteps=timesteps, nfe=nfe, latents=latents)


@torch.no_grad()
def euler(
    velocity: VelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any = None,
    keep_latents: bool = False,
) -> Rollout:
    """Explicit Euler, first order: ``x_{i+1} = x_i + h_i v(x_i, t_i)`` with ``h_i = t_{i+1} - t_i < 0``."""
    states = [noise]
    for t, t_next in zip(timesteps[:-1], timesteps[1:]):
        x = states[-1]
        states.append(x + (t_next - t).to(x.dtype) * velocity(x, _times(t, x), cond))
        if not keep_latents:
            states = states[-1:]
    return _rollout(states, timesteps, len(timesteps) - 1, keep_latents)


@torch.no_grad()
def heun(
    velocity: VelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any = None,
    keep_latents: bool = False,
) -> Rollout:
    """Heun's method, second order (two evaluations per step)::

    x~ = x_i + h v(x_i, t_i)
    x_{i+1} = x_i + h/2 [v(x_i, t_i) + v(x~, t_{i+1})]
    """
    states = [noise]
    for t, t_next in zip(timesteps[:-1], timesteps[1:]):
        x = states[-1]
        h = (t_next - t).to(x.dtype)
        slope = velocity(x, _times(t, x), cond)
        predictor = x + h * slope
        states.append(x + 0.5 * h * (slope + velocity(predictor, _times(t_next, x), cond)))
        if not keep_latents:
            states = states[-1:]
    return _rollout(states, timesteps, 2 * (len(timesteps) - 1), keep_latents)


@torch.no_grad()
def dpm_solver_2m(
    velocity: VelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any = None,
    keep_latents: bool = False,
) -> Rollout:
    """DPM-Solver++(2M), the second-order multistep solver in data prediction, for flow matching.

    With ``alpha_t = 1 - t``, ``sigma_t = t``, ``lambda_t = log(alpha_t / sigma_t)``,
    the data prediction ``D_i = x_i - t_i v(x_i, t_i)`` and ``h_i = lambda_{i+1} - lambda_i``::

        x_{i+1} = (sigma_{i+1} / sigma_i) x_i + alpha_{i+1} (1 - e^{-h_i}) D~_i
        D~_i = D_i + (D_i - D_{i-1}) h_i / (2 h_{i-1})

    One evaluation per step. Steps without a finite previous ``h`` (the first
    two, since ``lambda_1 = -inf``) and the last step (``lambda_0 = +inf``) are
    first order, as in DPM-Solver++; the first-order step is
    ``x_{i+1} = t_{i+1}/t_i x_i + (1 - t_{i+1}/t_i) D_i`` (DDIM, which is Euler
    for flows). A bounded number of first-order steps keeps the global error
    second order. On a grid uniform in t that reaches t = 0 and t = 1 the
    log-SNR steps at both ends stay large, which adds a slowly vanishing
    ``log N`` factor to the error; inside (0, 1) its error falls 4x per doubling.
    """
    states = [noise]
    previous_data: torch.Tensor | None = None
    previous_h: float | None = None
    steps = len(timesteps) - 1
    for t, t_next in zip(timesteps[:-1].tolist(), timesteps[1:].tolist()):
        x = states[-1]
        data = x - t * velocity(x, _times(torch.tensor(t), x), cond)
        # h is finite only strictly inside (0, 1); a step touching t = 1 or t = 0 has no usable h.
        h = _log_snr(t_next) - _log_snr(t) if 0.0 < t_next < t < 1.0 else None
        if previous_h is None or h is None:
            estimate = data
        else:
            estimate = data + (data - previous_data) * (h / (2.0 * previous_h))
        # sigma_{i+1}/sigma_i = t_{i+1}/t_i and alpha_{i+1} (1 - e^{-h}) = 1 - t_{i+1}/t_i.
        sigma_ratio = t_next / t
        states.append(sigma_ratio * x + (1.0 - sigma_ratio) * estimate)
        previous_data, previous_h = data, h
        if not keep_latents:
            states = states[-1:]
    return _rollout(states, timesteps, steps, keep_latents)


def _log_snr(t: float) -> float:
    """``lambda_t = log((1 - t) / t)`` for 0 < t < 1."""
    return float(torch.log(torch.tensor((1.0 - t) / t, dtype=torch.float64)))
