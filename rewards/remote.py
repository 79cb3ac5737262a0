"""Remote rewards over HTTP with JSON: the wire format and the client.

Protocol (version 1), media as base64-encoded 8-bit PNG, never pickle:

    GET  /health -> {"status": "ok", "reward": NAME, "modality": "image" | "video", "protocol": 1}
    POST /score  {"prompts": [str], "metadata": [object],   (metadata optional: one {} per item)
                  "images": [png_b64]                       (image rewards)
                  | "videos": [[png_b64 per frame]]}        (video rewards)
             -> {"scores": {label: [float]}}     one list per sub-score, one value per item
             -> 400 {"error": message}   malformed request: not JSON, wrong types (a prompt that is
                                         not a string, metadata that are not objects), lengths that
                                         differ, media that are not PNG or differ in size, the wrong
                                         modality
             -> 413 {"error": message}   over one of the server's limits (body bytes, items, frames,
                                         pixels per image or per request); send smaller batches
             -> 422 {"error": message}   the reward broke its contract (NaN, wrong shape)
             -> 500 {"error": message}   the reward raised (a bug, or input it cannot score)
             -> 503 {"error": message}   transient: the reward ran out of memory, or the server is busy

Only 503 (and a gateway's 502/504, a refused connection, a timeout) is worth
retrying; every other error answer is final. Error messages are short and
never echo the request.

The reference server is ``flowrl reward-server`` (``rewards.server``); any
other service speaking this protocol works too, e.g. ImageReward in its own
environment (see the README).
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from rewards.base import RewardError, checked_scores

PROTOCOL_VERSION = 1
#: HTTP answers worth retrying: a gateway or the reward is (perhaps briefly) unavailable.
RETRIED_STATUSES = (502, 503, 504)
#: Transport failures worth retrying: the server is down, restarting or slow.
RETRIED_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def encode_image(image: torch.Tensor) -> str:
    """``[3, H, W]`` in [0, 1] -> base64 PNG (8-bit)."""
    pixels = (
        (image.detach().float().clamp(0, 1).cpu().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    )
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def open_png(data: str) -> Image.Image:
    """A base64 PNG opened lazily: its header (size, mode) is read, its pixels are not decoded yet."""
    return Image.open(io.BytesIO(base64.b64decode(data, validate=True)), formats=["PNG"])


def image_tensor(image: Image.Image) -> torch.Tensor:
    """Decode an opened image (and close it) -> ``[3, H, W]`` float32 in [0, 1]."""
    with image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).permute(2, 0, 1)


def decode_image(data: str) -> torch.Tensor:
    """base64 PNG -> ``[3, H, W]`` float32 in [0, 1] (no size limit: servers check ``open_png`` first)."""
    return image_tensor(open_png(data))


def encode_media(media: torch.Tensor, modality: str) -> dict[str, list]:
    """The media part of a ``/score`` request."""
    if modality == "image":
        return {"images": [encode_image(image) for image in media]}
    return {"videos": [[encode_image(frame) for frame in video] for video in media]}


def backoff_delays(first: float, cap: float) -> Iterator[float]:
    """Seconds to wait before each retry: ``first``, doubling, at most ``cap``, forever."""
    delay = min(first, cap)
    while True:
        yield delay
        delay = min(2 * delay, cap)


class _Transient(Exception):
    """A failure worth retrying (connection, timeout, HTTP 502/503/504)."""


def _require(ok: bool, name: str, value: object, allowed: str) -> None:
    if not ok:
        raise ValueError(f"RemoteReward {name}={value!r}; allowed: {allowed}")


class RemoteReward:
    """Client of a reward server: batching, a timeout per request, retries with backoff within a patience.

    At construction the server's ``/health`` is checked (for up to
    ``startup_patience`` seconds; ``None`` skips it): an unreachable server,
    or one serving another modality or protocol version, is a one-line
    :class:`~rewards.base.RewardError` at once rather than at the first batch.

    Transient failures (refused connections, timeouts, HTTP 502/503/504) are
    retried until ``patience`` seconds have passed since the first attempt,
    waiting ``backoff`` seconds, doubling up to ``max_backoff``, between
    attempts; the default (5 minutes) outlasts a server restart. Any other
    error answer (400, 413, 422, 500) is final: a :class:`RewardError` at
    once. Use it as a context manager (or call :meth:`close`) to release its
    connections.
    """

    #: it connects to the ``url`` its settings give (see :func:`rewards.registry.outside_settings`)
    outside_settings = ("url",)

    def __init__(
        self,
        url: str,
        modality: str = "image",
        batch_size: int = 32,
        timeout: float = 60.0,
        patience: float = 300.0,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
        startup_patience: float | None = 30.0,
    ) -> None:
        _require(modality in ("image", "video"), "modality", modality, "'image', 'video'")
        _require(batch_size >= 1, "batch_size", batch_size, "an integer >= 1")
        _require(timeout > 0, "timeout", timeout, "seconds > 0")
        _require(patience >= 0, "patience", patience, "seconds >= 0")
        _require(
            0 < backoff <= max_backoff, "backoff", backoff, f"seconds > 0 and <= max_backoff ({max_backoff})"
        )
        _require(
            startup_patience is None or startup_patience >= 0,
            "startup_patience",
            startup_patience,
            "seconds >= 0, or None to skip the start-up health check",
        )
        self.url = url.rstrip("/")
        self.modality = modality
        self.batch_size, self.patience = batch_size, patience
        self.backoff, self.max_backoff = backoff, max_backoff
        self.client = httpx.Client(timeout=timeout)
        if startup_patience is not None:
            try:
                self._check_health(startup_patience)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self.client.close()

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` answer."""
        return self._request("GET", "/health", None, self.patience)

    def _check_health(self, patience: float) -> None:
        """Raise :class:`RewardError` unless the server answers ``/health`` for this client's modality and protocol."""
        answer = self._request("GET", "/health", None, patience)
        if not isinstance(answer, dict) or answer.get("status") != "ok":
            raise RewardError(
                f"reward server {self.url} answered /health with {str(answer)[:200]!r}, not 'ok'"
            )
        if answer.get("protocol") != PROTOCOL_VERSION:
            raise RewardError(
                f"reward server {self.url} speaks protocol {answer.get('protocol')!r}; this client speaks {PROTOCOL_VERSION}"
            )
        if answer.get("modality") != self.modality:
            raise RewardError(
                f"reward server {self.url} serves {answer.get('reward')!r} on {answer.get('modality')!r} media; "
                f"this client has modality={self.modality!r}"
            )

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None, patience: float) -> Any:
        """The JSON answer, retrying transient failures with backoff for up to ``patience`` seconds."""
        start = time.monotonic()
        delays = backoff_delays(self.backoff, self.max_backoff)
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._attempt(method, path, body)
            except _Transient as error:
                last_error = str(error)
            waited = time.monotonic() - start
            if waited >= patience:
                raise RewardError(
                    f"reward server {self.url} did not answer {method} {path}: {attempts} attempts in "
                    f"{waited:.1f} s (patience {patience:g} s); last error: {last_error}"
                )
            time.sleep(min(next(delays), patience - waited))

    def _attempt(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        """One request: its JSON answer, :class:`_Transient` if worth retrying, else :class:`RewardError`."""
        try:
            response = self.client.request(method, self.url + path, json=body)
        except RETRIED_ERRORS as error:
            raise _Transient(f"{type(error).__name__}: {error}") from error
        except (httpx.TransportError, httpx.InvalidURL) as error:
            raise RewardError(
                f"reward server {self.url} cannot be reached: {type(error).__name__}: {error}"
            ) from error
        if response.status_code in RETRIED_STATUSES:
            raise _Transient(f"HTTP {response.status_code}: {response.text[:500]}")
        if response.status_code >= 400:
            raise RewardError(
                f"reward server {self.url} refused the request: HTTP {response.status_code}: {response.text[:500]}"
            )
        try:
            return response.json()
        except ValueError as error:
            raise RewardError(
                f"reward server {self.url}{path} answered HTTP {response.status_code} with a body that is not JSON: "
                f"{response.text[:200]!r}"
            ) from error

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
            answer = self._request("POST", "/score", body, self.patience)
            if not isinstance(answer, dict) or not isinstance(answer.get("scores"), dict):
                raise RewardError(f"reward server {self.url} answered without 'scores': {str(answer)[:200]}")
            scores = {
                key: torch.tensor(values, dtype=torch.float32) for key, values in answer["scores"].items()
            }
            parts.append(checked_scores(f"remote:{self.url}", scores, len(body["prompts"])))
        return {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
