"""Off-policy demonstrations: the prompt's true scene, rendered by the world, in the model's sample space.

SePPO trains on "winning" images it did not generate (the paper takes the preferred images of
Pick-a-Pic). The shapes worlds can draw a correct image or clip for any prompt record (the renderer
that made the pretraining data), so here the winner of a prompt is a fresh render of its scene: the
layout is drawn from ``np.random.default_rng(seed)`` with the sample's own seed, so a sample's winner
does not depend on how the batch is split over processes. The render is mapped to the sampler's space
by the backend's ``encode_media`` (pixels for the shapes models, the VAE's latents for diffusers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from flowrl.policy import Policy
    from flowrl.worlds import PromptRecord, World


def media_shape(policy: Policy) -> tuple[int, ...]:
    """The decoded shape of one sample, ``(3, H, W)`` or ``(T, 3, H, W)``: what a render must match."""
    with torch.no_grad():
        return tuple(policy.decode(policy.initial_noise([0], policy.device)).shape[1:])


def rendered_winners(
    world: World,
    policy: Policy,
    records: Sequence[PromptRecord],
    seeds: Sequence[int],
    shape: tuple[int, ...],
) -> torch.Tensor:
    """Model-space renders of ``records``' scenes, row ``i`` laid out by ``default_rng(seeds[i])``."""
    if not hasattr(policy.flow_model, "encode_media"):
        raise ValueError(
            f"the {type(policy.flow_model).__name__} backend has no encode_media: rendered winners cannot "
            "be mapped to its sample space"
        )
    missing = [record.get("prompt") for record in records if "include" not in record]
    if missing:
        raise ValueError(
            f"prompt {missing[0]!r} has no scene metadata ('include'): rendered winners need the prompts of a "
            f"shapes world (data.prompts: {world.train_prompts_name}, or records of its grammar)"
        )
    media = np.stack(
        [world.render(record, np.random.default_rng(seed), shape) for record, seed in zip(records, seeds)]
    )
    return policy.flow_model.encode_media(torch.from_numpy(media).movedim(-1, -3).contiguous())
