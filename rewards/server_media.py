"""The reward server's media checks and decoding: every PNG header is checked before any pixel is decoded,
then the images are decoded one at a time into one float32 tensor, each base64 string dropped as soon as
its image is in place, so that a request holds its media and one image's transients, not two copies."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from fastapi import HTTPException
from PIL import Image
from pydantic import BaseModel, StrictStr

from rewards.remote import open_png
from rewards.server_limits import Limits

#: Longest error message the server sends.
MAX_MESSAGE = 300


class ScoreRequest(BaseModel):
    """The body of ``POST /score`` (``rewards.remote`` protocol); ``metadata`` defaults to ``{}`` per item."""

    prompts: list[StrictStr]
    metadata: list[dict[str, Any]] | None = None
    images: list[StrictStr] | None = None
    videos: list[list[StrictStr]] | None = None


def shorten(message: str) -> str:
    """``message`` cut to ``MAX_MESSAGE`` characters."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def refuse(status: int, message: str) -> HTTPException:
    """The HTTP error to raise, its message clipped."""
    return HTTPException(status_code=status, detail=shorten(message))


def media_items(request: ScoreRequest, name: str, modality: str, limits: Limits) -> list[list[str]]:
    """Each item's frames (one per image), after checking modality, lengths, items and frames."""
    if (request.images is None) == (request.videos is None):
        raise refuse(400, "bad request: needs exactly one of 'images' or 'videos'")
    sent = "image" if request.images is not None else "video"
    if sent != modality:
        raise refuse(400, f"reward {name!r} takes {modality} media, got {sent}")
    items = [[image] for image in request.images] if request.images is not None else request.videos
    metadata = len(items) if request.metadata is None else len(request.metadata)
    if not items or not len(request.prompts) == metadata == len(items):
        raise refuse(
            400, f"{len(items)} media, {len(request.prompts)} prompts and {metadata} metadata entries"
        )
    if len(items) > limits.max_items:
        raise refuse(413, f"{len(items)} items; this server's max_items={limits.max_items}")
    frames = sorted({len(item) for item in items})
    if frames[0] == 0 or len(frames) > 1:
        raise refuse(400, f"videos need one number of frames >= 1; got {frames[:5]}")
    if frames[0] > limits.max_frames:
        raise refuse(413, f"{frames[0]} frames per video; this server's max_frames={limits.max_frames}")
    request.images = request.videos = None  # the items own the strings now, to be dropped one by one
    return items


def location(modality: str, item: int, frame: int) -> str:
    """Where a PNG sits in the request, e.g. ``images[3]`` or ``videos[1][4]``."""
    return f"images[{item}]" if modality == "image" else f"videos[{item}][{frame}]"


def open_item(data: str, where: str, limits: Limits) -> Image.Image:
    """One PNG opened lazily (header only), or 400 if it is not one, 413 if it has too many pixels."""
    try:
        image = open_png(data)
    except Image.DecompressionBombError as error:  # Pillow's own, higher limit
        raise refuse(413, f"{where} is over this server's max_pixels={limits.max_pixels}: {error}") from error
    except Exception as error:
        raise refuse(400, f"{where} is not a base64 PNG: {type(error).__name__}: {error}") from error
    width, height = image.size
    if width * height > limits.max_pixels:
        image.close()
        raise refuse(413, f"{where} is {width}x{height} pixels; this server's max_pixels={limits.max_pixels}")
    return image


def media_size(items: list[list[str]], modality: str, limits: Limits) -> tuple[int, int]:
    """The one ``(width, height)`` of every PNG, read from their headers (each opened and closed)."""
    sizes = set()
    for i, item in enumerate(items):
        for t, data in enumerate(item):
            with open_item(data, location(modality, i, t), limits) as image:
                sizes.add(image.size)
            if len(sizes) > 1:
                raise refuse(400, f"media need one size; got (width, height) {sorted(sizes)}")
    (width, height), frames = sizes.pop(), len(items[0])
    total = len(items) * frames * width * height
    if total > limits.max_total_pixels:
        raise refuse(413, f"{total} pixels in all; this server's max_total_pixels={limits.max_total_pixels}")
    return width, height


def decode_into(target: torch.Tensor, image: Image.Image) -> None:
    """Decode an opened image into ``target`` (``[3, H, W]`` float32, values ``u8 / 255`` as
    ``rewards.remote.image_tensor`` gives them); its transients are Pillow's and one 8-bit array."""
    with image:
        pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
        target.copy_(pixels).div_(255.0)


def decode_items(items: list[list[str]], modality: str, size: tuple[int, int]) -> torch.Tensor:
    """``[B, 3, H, W]`` or ``[B, T, 3, H, W]`` from PNGs of ``size = (width, height)`` (what
    :func:`media_size` found in their headers); each string is emptied once its image is in place."""
    width, height = size
    frames = len(items[0])
    media = torch.empty(len(items) * frames, 3, height, width)
    for i, item in enumerate(items):
        for t, data in enumerate(item):
            where = location(modality, i, t)
            try:
                decode_into(media[i * frames + t], open_png(data))
            except Exception as error:
                raise refuse(400, f"{where} cannot be decoded: {type(error).__name__}: {error}") from error
            item[t] = ""
    return media if modality == "image" else media.view(len(items), frames, 3, height, width)
