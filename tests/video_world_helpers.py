"""The video world tests' shared pieces: tiny video models, clips of records, centroids, GIF frames and
the ground-truth sampler."""

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.video_shapes import grammar
from flowrl.video_shapes.render import (
    NUM_FRAMES,
    render_clip,
)
from flowrl.worlds import WORLDS

VIDEO = WORLDS["video_shapes"]
FRAMES = 4  #: frames of the tiny video models
TINY_SIZES = dict(hidden_size=32, depth=1, num_heads=2, text_hidden_size=32, text_layers=1)


def tiny_video_config(num_frames: int = FRAMES, frame_patch: int = 2, **changes) -> ShapesDiTConfig:
    return ShapesDiTConfig(
        vocabulary=grammar.vocabulary(),
        patch_size=4,
        num_frames=num_frames,
        frame_patch=frame_patch,
        **TINY_SIZES,
        **changes,
    )


def randomised(model: ShapesDiT, seed: int = 0) -> ShapesDiT:
    """adaLN-zero starts at v = 0; give every weight a value so outputs depend on inputs (as conftest does)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def tiny_video_model(frame_patch: int = 2, seed: int = 0, **changes) -> ShapesDiT:
    torch.manual_seed(seed)
    return randomised(ShapesDiT(tiny_video_config(frame_patch=frame_patch, **changes)), seed)


def clips_of(records_and_seeds, num_frames: int = NUM_FRAMES) -> torch.Tensor:
    """Ground-truth clips ``[B, T, 3, H, W]`` rendered with ``default_rng(seed)`` (colour_drift's convention)."""
    rendered = [
        render_clip(record, np.random.default_rng(seed), num_frames) for record, seed in records_and_seeds
    ]
    return torch.from_numpy(np.stack(rendered)).movedim(-1, -3)


def centroids(clip: np.ndarray) -> np.ndarray:
    """``[T, 2]`` intensity-weighted centroids (x, y) of a single-object clip ``[T, H, W, 3]``."""
    weight = clip.sum(-1)
    ys, xs = np.mgrid[: clip.shape[1], : clip.shape[2]]
    total = weight.sum((1, 2))
    return np.stack([(weight * xs).sum((1, 2)) / total, (weight * ys).sum((1, 2)) / total], axis=1)


def gif_frames(path: Path) -> int:
    with Image.open(path) as image:
        assert image.format == "GIF"
        return image.n_frames


def ground_truth_sampler(num_frames: int = NUM_FRAMES):
    """An ``ImageSampler`` that returns the renderer's clip for each (prompt, seed) of the test split."""
    by_prompt = {record["prompt"]: record for record in VIDEO.prompts("test")}

    def sample(prompts, seeds, num_steps, guidance_scale):
        return clips_of([(by_prompt[p], s) for p, s in zip(prompts, seeds)], num_frames)

    return sample
