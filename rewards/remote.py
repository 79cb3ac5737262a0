"""Remote rewards over HTTP with JSON: the wire format and the client.

Protocol (version 1), media as base64-encoded 8-bit PNG, never pickle:

    GET  /health -> {"status": "ok", "reward": NAME, "modality": "image" | "video", "protocol": 1}
    POST /score  {"prompts": [str], "metadata": [object],
                  "images": [png_b64]                       (image rewards)
                  | "videos": [[png_b64 per frame]]}        (video rewards)
             -> {"scores": {label: [float]}}     one list per sub-score, one value per item
             -> 400 {"error": message}           malformed request, wrong modality
             -> 422 {"error": message}           the reward broke its contract (NaN, shape)
             -> 503 {"error": message}           the reward raised (may be transient)

The reference server is ``flowrl reward-server`` (``rewards.server``); any
other service speaking this protocol works too, e.g. ImageReward in its own
environment (see the README).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from rewards.base import RewardError, checked_scores

PROTOCOL_VERSION = 1
#: HTTP answers worth retrying: a gateway or the reward is (perhaps briefly) unavailable.
RETRIED_STATUSES = (502, 503, 504)


def encode_image(image: torch.Tensor) -> str:
    """``[3, H, W]`` in [0, 1] -> base64 PNG (8-bit)."""
    pixels = (
        (image.detach().float().clamp(0, 1).cpu().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    )
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_image(data: str) -> torch.Tensor:
    """base64 PNG -> ``[3, H, W]`` float32 in [0, 1]."""
    with Image.open(io.BytesIO(base64.b64decode(data, validate=True))) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1)


def encode_media(media: torch.Tensor, modality: str) -> dict[str, list]:
    """The media part of a ``/score`` request."""
    if modality == "image":
        return {"images": [encode_image(image) for image in media]}
    return {"videos": [[encode_image(frame) for frame in video] for video in media]}


def decode_media(body: Mapping[str, Any]) -> tuple[torch.Tensor, str]:
    """``(media, modality)`` from a ``/score`` request body."""
    if "images" in body:
        return torch.stack([decode_image(item) for item in body["images"]]), "image"
    if "videos" in body:
        return torch.stack(
            [torch.stack([decode_image(f) for f in video]) for video in body["videos"]]
        ), "video"
    raise ValueError("request needs 'images' or 'videos'")


class RemoteReward:
    """Client of a reward server: batching, a timeout per request, bounded retries with backoff.

    Transient failures (connection errors, timeouts, HTTP 502/503/504) are
    retried ``retries`` times with exponential backoff (``backoff * 2^k``
    seconds); any other error answer, or a server that stays down, is a
    :class:`~rewards.base.RewardError`. Use it as a context manager (or call
    :meth:`close`) to release its connections.
    """

    def __init__(
        self,
        url: str,
        modality: str = "image",
        batch_size: int = 32,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if modality not in ("image", "video"):
            raise ValueError(f"unknown modality {modality!r}; allowed: 'image', 'video'")
        if batch_size < 1 or retries < 0 or timeout <= 0:
            raise ValueError(
                f"need batch_size >= 1, retries >= 0, timeout > 0; got {batch_size}, {retries}, {timeout}"
            )
        self.url = url.rstrip("/")
        self.modality = modality
        self.batch_size, self.retries, self.backoff = batch_size, retries, backoff
        self.client = httpx.Client(timeout=timeout)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer."""
        return self._request("GET", "/health", None)

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self.client.request(method, self.url + path, json=body)
            except httpx.TransportError as error:
                last_error = f"{type(error).__name__}: {error}"
                continue
            if response.status_code in RETRIED_STATUSES:
                last_error = f"HTTP {response.status_code}: {response.text[:500]}"
                continue
            if response.status_code >= 400:
                raise RewardError(
                    f"reward server {self.url} refused the request: HTTP {response.status_code}: {response.text[:500]}"
                )
            return response.json()
        raise RewardError(
            f"reward server {self.url}{path} failed {self.retries + 1} times; last error: {last_error}"
        )

    def __call__(
        self, media: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        if media.shape[0] == 0:
            raise RewardError(f"remote reward {self.url} was given an empty batch")
        parts: list[dict[str, torch.Tensor]] = []
        for start in range(0, media.shape[0], self.batch_size):
            stop = start + self.batch_size
            body = {
                "prompts": list(prompts[start:stop]),
                "metadata": [dict(meta) for meta in metadata[start:stop]],
                **encode_media(media[start:stop], self.modality),
            }
            answer = self._request("POST", "/score", body)
            if "scores" not in answer:
                raise RewardError(f"reward server {self.url} answered without 'scores': {str(answer)[:200]}")
            scores = {
                key: torch.tensor(values, dtype=torch.float32) for key, values in answer["scores"].items()
            }
            parts.append(checked_scores(f"remote:{self.url}", scores, len(body["prompts"])))
        return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
