"""Mean brightness: the simplest reward any correct RL implementation raises within a few steps.

``brightness = mean_{c, h, w} x_{c, h, w}`` of each image in [0, 1] (for a
video, over all frames too). It is differentiable in the pixels and every
sample of a group scores differently, so group advantages are never all
zero: the first rung of flowrl's sanity ladder (``scripts/sanity_ladder.py``),
where an algorithm whose update has the wrong sign, a detached gradient or a
zero advantage shows at once. Weight it negatively for "darkness".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rewards.registry import register


@register("brightness")
def brightness(
    images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> torch.Tensor:
    """Mean pixel value in [0, 1] of each image ``[B, 3, H, W]`` (or video ``[B, T, 3, H, W]``)."""
    pixels = images.detach().float().clamp(0, 1)
    return pixels.flatten(1).mean(dim=1).cpu()
