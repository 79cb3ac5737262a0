"""JPEG compressibility and incompressibility (DDPO's classic rewards).

Each image is encoded as JPEG at quality 95 (PIL); the file size in
kilobytes ``s`` gives ``compressibility = -s`` and ``incompressibility = s``.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from rewards.registry import register

JPEG_QUALITY = 95


def jpeg_kilobytes(images: torch.Tensor) -> torch.Tensor:
    """Size in kB of each ``[B, 3, H, W]`` image in [0, 1] as a quality-95 JPEG."""
    pixels = (
        (images.detach().float().clamp(0, 1).cpu().permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    )
    sizes = []
    for image in pixels:
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="JPEG", quality=JPEG_QUALITY)
        sizes.append(buffer.tell() / 1000.0)
    return torch.tensor(sizes, dtype=torch.float32)


@register("jpeg_compressibility")
def jpeg_compressibility(
    images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> torch.Tensor:
    """``-kB`` of each image as a quality-95 JPEG: simpler images score higher."""
    return -jpeg_kilobytes(images)


@register("jpeg_incompressibility")
def jpeg_incompressibility(
    images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> torch.Tensor:
    """``kB`` of each image as a quality-95 JPEG: more detailed images score higher."""
    return jpeg_kilobytes(images)
