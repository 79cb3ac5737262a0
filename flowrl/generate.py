"""Text-to-image (and text-to-clip) generation with a shapes-world model through ``samplers/``.

Pixels: the model works on ``x = 2 image - 1``; images are returned in [0, 1].
Noise: image ``i`` starts from ``randn`` seeded with ``seeds[i]``, so a given
(prompt, seed) gives the same image whatever batch it is generated in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flowrl.models.shapes_dit import ShapesDiT
from samplers import ODE_SOLVERS, guided_average_velocity, guided_velocity, meanflow_sample, timesteps


def seeded_noise(
    seeds: Sequence[int], shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[len(seeds), *shape]`` standard normal noise, row ``i`` drawn from a generator seeded with ``seeds[i]``."""
    rows = [torch.randn(shape, generator=torch.Generator().manual_seed(int(seed))) for seed in seeds]
    return torch.stack(rows).to(device)


def images_to_model_space(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] images to the model's [-1, 1] pixels."""
    return images * 2.0 - 1.0


def model_space_to_images(x: torch.Tensor) -> torch.Tensor:
    """The model's pixels to [0, 1] images (clamped)."""
    return ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)


@torch.no_grad()
def generate(
    model: ShapesDiT,
    prompts: Sequence[str],
    seeds: Sequence[int],
    num_steps: int = 20,
    guidance_scale: float = 1.0,
    time_shift: float = 1.0,
    batch_size: int = 128,
    solver: str = "euler",
) -> torch.Tensor:
    """Images ``[B, 3, H, W]`` (clips ``[B, T, 3, H, W]`` from a video model) in [0, 1] for prompts and
    seeds, optional CFG (1.0 = off).

    ``solver`` names one of ``samplers.ODE_SOLVERS`` (``euler``, ``heun``, ``dpm2m``); a MeanFlow model
    always takes ``num_steps`` average-velocity steps (``x_r = x_t - (t - r) u``) instead.
    """
    if len(prompts) != len(seeds):
        raise ValueError(f"got {len(prompts)} prompts but {len(seeds)} seeds")
    if solver not in ODE_SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; allowed: {sorted(ODE_SOLVERS)}")
    config = model.config
    shape = model.sample_shape
    schedule = timesteps(num_steps, shift=time_shift)
    device = next(model.parameters()).device
    outputs = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        cond = model.encode_prompts(chunk)
        velocity = guided_velocity(
            lambda x, t, c: model(x, t, *c), guidance_scale, model.encode_prompts([""] * len(chunk))
        )
        noise = seeded_noise(seeds[start : start + batch_size], shape, device)
        if config.mean_flow:
            average = guided_average_velocity(
                lambda x, r, t, c: model(x, t, *c, r=r),
                guidance_scale,
                model.encode_prompts([""] * len(chunk)),
            )
            outputs.append(model_space_to_images(meanflow_sample(average, noise, schedule, cond).x0))
            continue
        outputs.append(model_space_to_images(ODE_SOLVERS[solver](velocity, noise, schedule, cond).x0))
    return torch.cat(outputs)
