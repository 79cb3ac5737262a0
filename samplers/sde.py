"""Stochastic samplers with per-step log-probabilities (Flow-GRPO), and their re-scoring.

Flow-SDE (``variant="flow"``), with ``sigma = t_i``, ``dt = t_{i+1} - t_i < 0``
and noise level ``a``::

    std  = a sqrt(sigma / (1 - sigma))          (at sigma = 1: 1 - t_{i+1} in the denominator)
    mean = x (1 + std^2 dt / (2 sigma)) + v (1 + std^2 (1 - sigma) / (2 sigma)) dt
    x'   = mean + std sqrt(-dt) eps

DanceGRPO's SDE (``variant="dance"``, the step BranchGRPO's code takes), noise
level ``eta``::

    std  = eta sqrt(-dt),   x0^ = x - sigma v,   score = -(x - (1 - sigma) x0^) / sigma^2
    mean = x + v dt - eta^2 score dt / 2,       x' = mean + std eps

Coefficient-preserving sampling (``variant="cps"``), which keeps the
coefficients of the predicted data and noise on the flow's interpolant::

    x0^ = x - sigma v,   eps^ = x + (1 - sigma) v,   s = t_{i+1} sin(a pi / 2)
    mean = (1 - t_{i+1}) x0^ + sqrt(t_{i+1}^2 - s^2) eps^,    x' = mean + s eps

The log-probability of ``x'`` is that of the Gaussian ``N(mean, scale^2)``
(``scale = std sqrt(-dt)`` or ``s``), averaged over dimensions; except for
``variant="cps"``, which scores a step as Flow-GRPO's reference code does,
``-mean ||x' - mean||^2`` without the Gaussian's ``1 / (2 s^2)`` and its
normaliser (``"cps_gaussian"`` is the same step with the exact Gaussian
log-probability). ``std_dev`` is the reference's ``std_dev_t`` (``std`` for
the Flow-SDE, ``s`` for CPS), the scale its KL term divides by. All of it is
computed in float32 whatever the model's dtype. :func:`sde_step` is the one
code path for sampling (draw ``x'``) and for re-scoring a stored transition
under another velocity (given ``x'``), which is what the GRPO ratio needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from samplers.rollout import Rollout, VelocityFn

VARIANTS = ("flow", "dance", "cps", "cps_gaussian")


@dataclass
class SDEStep:
    """One stochastic transition: the next state, its log-probability ``[B]``, the mean, the scale of
    the step's noise and the reference's ``std_dev_t`` (module docstring)."""

    x_next: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor
    std_dev: torch.Tensor


def _column(value: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """``value`` (scalar or ``[B]``) as float32 of shape ``[B, 1, ..., 1]`` broadcasting against ``x``."""
    value = torch.as_tensor(value, dtype=torch.float32, device=x.device)
    return value.reshape(-1, *([1] * (x.ndim - 1))) if value.ndim else value


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``log N(x; mean, scale^2)`` per element, averaged over all but the first dimension."""
    density = -((x - mean) ** 2) / (2 * scale**2) - torch.log(scale) - 0.5 * math.log(2 * math.pi)
    return density.mean(dim=tuple(range(1, density.ndim)))


def sde_step(
    v: torch.Tensor,
    x: torch.Tensor,
    t: torch.Tensor | float,
    t_next: torch.Tensor | float,
    noise_level: float | torch.Tensor,
    variant: str = "flow",
    x_next: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> SDEStep:
    """One SDE transition from ``x`` at ``t`` to ``t_next`` given the velocity ``v`` (see module docstring).

    With ``x_next`` given, its log-probability is evaluated (re-scoring);
    otherwise ``x_next = mean + scale * noise`` (``noise`` standard normal,
    drawn when absent). ``t``, ``t_next`` and ``noise_level`` are scalars or
    ``[B]`` (a tree's edges carry their own level). The scale must be
    positive: a deterministic step is an ODE step, not this.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown SDE variant {variant!r}; allowed: {VARIANTS}")
    x, v = x.float(), v.float()
    sigma, sigma_next = _column(t, x), _column(t_next, x)
    dt = sigma_next - sigma
    level = _column(noise_level, x)
    if variant == "flow":
        denominator = 1 - torch.where(sigma == 1, sigma_next, sigma)
        std = level * torch.sqrt(sigma / denominator)
        mean = x * (1 + std**2 * dt / (2 * sigma)) + v * (1 + std**2 * (1 - sigma) / (2 * sigma)) * dt
        scale = std * torch.sqrt(-dt)
        std_dev = std
    elif variant == "dance":
        scale = std_dev = level * torch.sqrt(-dt)
        score = -(x - (1 - sigma) * (x - sigma * v)) / sigma**2
        mean = x + v * dt - 0.5 * level**2 * score * dt
    else:
        scale = sigma_next * torch.sin(level * math.pi / 2)
        predicted_data = x - sigma * v
        predicted_noise = x + (1 - sigma) * v
        mean = (1 - sigma_next) * predicted_data + torch.sqrt(sigma_next**2 - scale**2) * predicted_noise
        std_dev = scale
    if not bool((scale > 0).all()):
        raise ValueError(
            f"zero noise scale in an SDE step (noise level {noise_level}, variant {variant!r}); "
            "deterministic steps are ODE steps"
        )
    if x_next is None:
        if noise is None:
            noise = torch.randn_like(mean)
        x_next = mean + scale * noise.float()
    else:
        x_next = x_next.detach().float()
    if variant == "cps":
        squared = (x_next - mean) ** 2
        log_prob = -squared.mean(dim=tuple(range(1, squared.ndim)))
    else:
        log_prob = gaussian_log_prob(x_next, mean, scale)
    return SDEStep(x_next, log_prob, mean, scale, std_dev)


def stochastic_steps(
    num_steps: int, noise_level: float, window: tuple[int, int] | None = None, include_last: bool = False
) -> torch.Tensor:
    """``[num_steps]`` bool: which steps are stochastic (and trainable).

    Not the last step (to t = 0) unless ``include_last`` (BranchGRPO's code trains it) and no window;
    with ``window = (start, end)`` only steps ``start <= i < end``; none when ``noise_level`` is 0.
    """
    steps = torch.zeros(num_steps, dtype=torch.bool)
    if noise_level <= 0:
        return steps
    start, end = window if window is not None else (0, num_steps)
    if not 0 <= start < end or start >= num_steps - 1:
        raise ValueError(
            f"SDE window {window} must satisfy 0 <= start < end and start < {num_steps - 1} "
            f"(the last of {num_steps} steps is never stochastic)"
        )
    steps[start : min(end, num_steps - 1)] = True
    if include_last and window is None:
        steps[-1] = True
    return steps


def sliding_window(
    iteration: int, size: int, num_steps: int, stride: int = 1, every: int = 1
) -> tuple[int, int]:
    """The SDE window ``(start, start + size)`` at a training iteration (MixGRPO's moving window).

    ``start = (iteration // every * stride) mod (num_steps - size)``: the
    window slides ``stride`` steps every ``every`` iterations over the steps
    ``0 .. num_steps - 2`` (the last step is never stochastic) and wraps.
    """
    if not 1 <= size <= num_steps - 1:
        raise ValueError(f"window size {size} must lie in [1, {num_steps - 1}] for {num_steps} steps")
    if stride < 1 or every < 1:
        raise ValueError(f"stride and every must be >= 1, got stride={stride}, every={every}")
    start = (iteration // every * stride) % (num_steps - size)
    return start, start + size


def draw_noise(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Standard normal float32 noise drawn on the CPU generator (reproducible on any device), moved to ``device``."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device)


@torch.no_grad()
def sde_sample(
    velocity: VelocityFn,
    noise: torch.Tensor,
    timesteps: torch.Tensor,
    cond: Any = None,
    noise_level: float = 0.7,
    variant: str = "flow",
    sde_window: tuple[int, int] | None = None,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Flow-SDE (or CPS) rollouts keeping every latent and log-probability.

    Steps outside :func:`stochastic_steps` are Euler ODE steps with log-prob 0.
    The velocity sees states in ``noise``'s dtype; latents are kept in float32.
    """
    num_steps = len(timesteps) - 1
    stochastic = stochastic_steps(num_steps, noise_level, sde_window)
    x = noise.float()
    latents = [x]
    log_probs = torch.zeros(noise.shape[0], num_steps, device=noise.device)
    for index in range(num_steps):
        t, t_next = timesteps[index], timesteps[index + 1]
        v = velocity(x.to(noise.dtype), t.to(noise.device).expand(x.shape[0]), cond).float()
        if stochastic[index]:
            step = sde_step(
                v, x, t, t_next, noise_level, variant, noise=draw_noise(tuple(x.shape), generator, x.device)
            )
            x = step.x_next
            log_probs[:, index] = step.log_prob
        else:
            x = x + (t_next - t).float() * v
        latents.append(x)
    return Rollout(
        x0=x.to(noise.dtype),
        timesteps=timesteps,
        nfe=num_steps,
        latents=torch.stack(latents, dim=1),
        log_probs=log_probs,
        trained_mask=stochastic,
    )


def transition_log_prob(
    velocity: VelocityFn,
    x: torch.Tensor,
    x_next: torch.Tensor,
    t: torch.Tensor,
    t_next: torch.Tensor,
    cond: Any,
    noise_level: float | torch.Tensor,
    variant: str = "flow",
    input_dtype: torch.dtype | None = None,
) -> SDEStep:
    """Re-score stored transitions ``x -> x_next`` (``t -> t_next``, ``[B]`` each) under ``velocity``.

    Gradients flow through the velocity (the GRPO ratio); the arithmetic is
    :func:`sde_step`'s, so re-scoring a rollout's own transitions with the
    sampling weights, the same batch and the same ``input_dtype`` (the dtype
    the sampler fed the network: ``rollout.x0.dtype``) returns its stored
    log-probabilities exactly. ``t`` and ``t_next`` are moved to ``x``'s device.
    """
    t, t_next = t.to(x.device), t_next.to(x.device)
    v = velocity(x.to(input_dtype or x.dtype), t, cond)
    return sde_step(v, x, t, t_next, noise_level, variant, x_next=x_next)
