"""Captioned grids of samples: a PNG for images, an animated GIF (one grid per frame) for clips."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

#: milliseconds per frame of an animated grid
FRAME_MILLISECONDS = 250


def image_grid(
    images: torch.Tensor,
    captions: Sequence[str] | None = None,
    columns: int = 8,
    tile_size: int = 128,
    caption_lines: int = 3,
) -> Image.Image:
    """A grid of ``[B, 3, H, W]`` images in [0, 1], each upscaled (nearest) to ``tile_size`` with its caption below."""
    count = images.shape[0]
    columns = max(1, min(columns, count))
    rows = (count + columns - 1) // columns
    font = ImageFont.load_default(size=11)
    line_height = 13
    caption_height = caption_lines * line_height + 4 if captions else 0
    characters_per_line = max(8, tile_size // 6)
    sheet = Image.new("RGB", (columns * tile_size, rows * (tile_size + caption_height)), "white")
    draw = ImageDraw.Draw(sheet)
    pixels = (
        (images.detach().float().clamp(0, 1).cpu().permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)
    )
    for index in range(count):
        left = (index % columns) * tile_size
        top = (index // columns) * (tile_size + caption_height)
        tile = Image.fromarray(pixels[index]).resize((tile_size, tile_size), Image.Resampling.NEAREST)
        sheet.paste(tile, (left, top))
        if captions:
            lines = textwrap.wrap(captions[index], characters_per_line)[:caption_lines]
            for line_index, line in enumerate(lines):
                draw.text(
                    (left + 2, top + tile_size + 2 + line_index * line_height), line, fill="black", font=font
                )
    return sheet


def video_grid_frames(
    videos: torch.Tensor, captions: Sequence[str] | None = None, columns: int = 8
) -> list[Image.Image]:
    """One :func:`image_grid` per frame of ``[B, T, 3, H, W]`` clips in [0, 1]: the frames of an animated grid."""
    return [image_grid(videos[:, frame], captions, columns) for frame in range(videos.shape[1])]


def save_grid(
    path: str | Path, media: torch.Tensor, captions: Sequence[str] | None = None, columns: int = 8
) -> Path:
    """Write a captioned grid of images ``[B, 3, H, W]`` (PNG at ``path``) or clips ``[B, T, 3, H, W]``
    (a looping animated GIF at ``path`` with the suffix ``.gif``, written with Pillow); return the path.

    Pillow stores consecutive identical frames of a GIF once with their durations summed, so a still
    clip plays for the same time but reads back with fewer frames."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if media.ndim == 4:
        image_grid(media, captions, columns).save(path)
        return path
    if media.ndim != 5:
        raise ValueError(
            f"a grid takes images [B, 3, H, W] or clips [B, T, 3, H, W], got {tuple(media.shape)}"
        )
    path = path.with_suffix(".gif")
    first, *rest = video_grid_frames(media, captions, columns)
    first.save(path, save_all=True, append_images=rest, duration=FRAME_MILLISECONDS, loop=0)
    return path
