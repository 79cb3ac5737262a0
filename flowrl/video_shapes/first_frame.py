"""Image-to-video on the moving-shapes world: the renderer draws frame 0, the model continues it.

Every prompt record of the image-to-video world carries ``first_frame_seed``, the seed of its scene's
layout (the tracks of :func:`flowrl.video_shapes.render.sample_motion_layout`); its conditioning image is
frame 0 of the clip that layout makes, and that clip is the record's ground truth. The seed is a hash of
the prompt and the split, so a prompt's first frame is the same in every run, process and evaluation. The
verifier is the video world's: it checks the whole clip (objects, colours, directions, speeds, arrivals)
against the prompt, whatever the model was given.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from flowrl.video_shapes import grammar
from flowrl.video_shapes.render import IMAGE_SIZE, NUM_FRAMES, render_clip

#: the key of a record's layout seed
SEED_KEY = "first_frame_seed"


def layout_seed(prompt: str, split: str) -> int:
    """The layout seed of ``prompt`` in ``split`` (a stable hash)."""
    digest = hashlib.blake2b(f"i2v\0{split}\0{prompt}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


def shipped_prompts(split: str) -> list[dict[str, Any]]:
    """The video world's shipped ``split`` prompts, each with its layout seed."""
    return [
        {**record, SEED_KEY: layout_seed(record["prompt"], split)}
        for record in grammar.shipped_prompts(split)
    ]


def shipped_records(prompts: Sequence[str]) -> list[dict[str, Any]]:
    """The world's records (either split) of ``prompts``, whose first frames an image-to-video model
    continues; a prompt the world does not ship is an error naming one it does."""
    by_prompt = {record["prompt"]: record for split in ("test", "train") for record in shipped_prompts(split)}
    unknown = sorted({prompt for prompt in prompts if prompt not in by_prompt})
    if unknown:
        raise ValueError(
            f"--prompt {unknown[0]!r} is not allowed for an image-to-video model: it continues the first frame "
            f"of a prompt the video_shapes_i2v world ships (flowrl/video_shapes/prompts/*.jsonl), e.g. "
            f"{next(iter(by_prompt))!r}"
        )
    return [by_prompt[prompt] for prompt in prompts]


def continued_clip(
    record: Mapping[str, Any], num_frames: int = NUM_FRAMES, image_size: int = IMAGE_SIZE
) -> np.ndarray:
    """The record's ground-truth clip ``[T, H, W, 3]`` in [0, 1]: its layout seed's scene; frame 0 is the
    conditioning image."""
    if SEED_KEY not in record:
        raise ValueError(
            f"prompt record {record.get('prompt')!r} has no {SEED_KEY}; image-to-video prompts come from "
            "data.prompts=video-shapes-i2v-train (or the world's shipped splits)"
        )
    return render_clip(record, np.random.default_rng(record[SEED_KEY]), num_frames, image_size)


def first_frames(records: Sequence[Mapping[str, Any]], sample_shape: tuple[int, ...]) -> torch.Tensor:
    """The records' conditioning images ``[B, 3, H, W]`` in [0, 1] for clips of ``sample_shape``
    ``(T, 3, H, W)``."""
    frames, size = sample_shape[0], sample_shape[-1]
    images = np.stack([continued_clip(record, frames, size)[0] for record in records])
    return torch.from_numpy(images).movedim(-1, -3)
