"""Text-to-image (and text-to-clip) generation with any policy, through ``samplers/``: the one sampling
loop behind ``flowrl sample``, ``flowrl eval``, evaluation during training and the demo app.

Noise: sample ``i`` starts from the flow model's noise seeded with ``seeds[i]``,
so a given (prompt, seed) gives the same sample whatever batch it is
generated in. Training rollouts take the same velocities
(:meth:`flowrl.policy.Policy.guided`) and noise, with the sampler their
algorithm needs (ODE, SDE or tree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from flowrl.policy import TUNED, Policy
from flowrl.video_shapes.first_frame import first_frames
from samplers import ODE_SOLVERS, guided_average_velocity, guided_velocity, meanflow_sample


def as_policy(model: Policy | nn.Module) -> Policy:
    """A policy as it is, or a bare shapes model (``ShapesDiT``) wrapped as an inference-only policy."""
    if isinstance(model, Policy):
        return model
    from flowrl.models import ShapesFlowModel

    return Policy.for_inference(ShapesFlowModel(model))


@torch.no_grad()
def generate(
    model: Policy | nn.Module,
    prompts: Sequence[str],
    seeds: Sequence[int],
    num_steps: int = 20,
    guidance_scale: float = 1.0,
    role: str = TUNED,
    solver: str = "euler",
    time_shift: float | None = None,
    negative_prompt: str = "",
    batch_size: int | None = None,
    records: Sequence[Mapping[str, Any]] | None = None,
) -> torch.Tensor:
    """Media in [0, 1] (images ``[B, 3, H, W]``, clips ``[B, T, 3, H, W]``) for prompts and seeds.

    ``model``: a policy (``role`` picks ``tuned`` or ``reference`` weights) or a bare shapes model.
    ``solver`` names one of ``samplers.ODE_SOLVERS`` (``euler``, ``heun``, ``dpm2m``) on the grid shifted by
    ``time_shift`` (None: the model's own default grid, :meth:`Policy.time_grid`); CFG against
    ``negative_prompt`` when ``guidance_scale > 1``. An image-to-video model continues the first frames of
    the prompts' ``records`` (:mod:`flowrl.video_shapes.first_frame`).
    A MeanFlow model always takes ``num_steps`` average-velocity steps (``x_r = x_t - (t - r) u``).
    """
    policy = as_policy(model)
    if len(prompts) != len(seeds):
        raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
    if solver not in ODE_SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; allowed: {sorted(ODE_SOLVERS)}")
    if policy.image_conditioned and (records is None or len(records) != len(prompts)):
        raise ValueError("an image-to-video model needs the prompt record (its first frame) of every prompt")
    grid = policy.time_grid(num_steps, time_shift)
    velocity = policy.velocity_of(role)
    batch_size = batch_size or policy.flow_model.generate_batch_size
    outputs = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        images = None
        if policy.image_conditioned:
            images = first_frames(records[start : start + batch_size], policy.sample_shape)
        cond = policy.encode(chunk, images)
        unconditional = None if guidance_scale == 1.0 else policy.encode([negative_prompt] * len(chunk))
        noise = policy.initial_noise(seeds[start : start + batch_size], policy.device)
        if policy.mean_flow:
            average = guided_average_velocity(
                lambda x, r, t, c: velocity(x, t, c, r=r), guidance_scale, unconditional
            )
            x0 = meanflow_sample(average, noise, grid, cond).x0
        else:
            x0 = ODE_SOLVERS[solver](
                guided_velocity(velocity, guidance_scale, unconditional), noise, grid, cond
            ).x0
        outputs.append(policy.decode(x0))
    return torch.cat(outputs)
