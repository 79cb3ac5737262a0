"""The reference reward server: serves any registered reward over the protocol of ``rewards.remote``.

    flowrl reward-server --reward clip_score --port 8700 --setting model_name=ViT-B-32

Built on FastAPI and uvicorn. ``/score`` reads the body itself, counting
bytes, then parses, validates and decodes it in a worker thread, so the event
loop keeps answering ``/health`` while a batch is scored; a lock scores
requests one at a time (the reward's models need not be thread-safe) and is
held around the reward call only. Answers:

  - 400: the request is malformed (not JSON, wrong types, lengths that
    differ, media that are not PNG) or carries the wrong modality; the
    reward is never called;
  - 413: the request is over one of the :class:`Limits` (checked on the
    Content-Length header, on the bytes as they arrive, then on the PNG
    headers, before any pixel is decoded);
  - 422: the reward broke its contract (NaN, wrong shape), the same
    boundary check as in-process scoring, or raised a ``RewardError``;
  - 500: the reward raised anything else; retrying cannot help;
  - 503: the reward ran out of memory, or ``max_in_flight`` requests are
    already in progress; the client may retry.

Error messages are at most a few hundred characters and never echo the
request. FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are off unless
``docs=True``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from PIL import Image
from pydantic import BaseModel, StrictStr, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewards.base import RewardError, checked_scores, modality_of
from rewards.remote import PROTOCOL_VERSION, image_tensor, open_png

#: Longest error message the server sends.
MAX_MESSAGE = 300


@dataclass(frozen=True)
class Limits:
    """What the server accepts; a request over a size limit is answered 413 before it is decoded.

    The defaults take the client's default batch (32 items) of images up to
    720x720, 16 at 1024x1024, or one or two 480x832 videos of 33 to 81 frames,
    and bound one request's decoded media to 384 MiB of float32 (3 GiB for
    the 8 requests of ``max_in_flight`` together, plus their bodies).
    """

    #: bytes of one request body (JSON with base64 PNGs): 64 MiB
    max_body_bytes: int = 64 * 2**20
    #: items (images or videos) in one request
    max_items: int = 64
    #: frames in one video
    max_frames: int = 128
    #: width x height of one image or frame: 2048 x 2048
    max_pixels: int = 2048 * 2048
    #: width x height summed over every image and frame of one request: 32 x 1024 x 1024
    max_total_pixels: int = 32 * 2**20
    #: requests being read, decoded or scored at once; more are answered 503 (busy), to retry
    max_in_flight: int = 8

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{field.name}={value!r}; allowed: an integer >= 1")


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


def validation_message(error: ValidationError) -> str:
    """Where and what is wrong in a request, without the input itself."""
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_context=False, include_input=False)[:3]
    ]
    more = error.error_count() - len(problems)
    return "bad request: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


async def read_body(request: Request, max_bytes: int) -> bytearray:
    """The request body, or 413 as soon as its declared or received size is over ``max_bytes``."""
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > max_bytes:
        raise refuse(413, f"body of {declared} bytes is over this server's max_body_bytes={max_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise refuse(413, f"body is over this server's max_body_bytes={max_bytes}")
    return body


def parse_request(raw: bytes | bytearray) -> ScoreRequest:
    """The validated request, or 400 naming what is wrong."""
    try:
        return ScoreRequest.model_validate_json(raw)
    except ValidationError as error:
        raise refuse(400, validation_message(error)) from error


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


def decode_items(items: list[list[str]], modality: str, limits: Limits) -> torch.Tensor:
    """``[B, 3, H, W]`` or ``[B, T, 3, H, W]``; every PNG header is checked before any pixel is decoded."""
    opened: list[Image.Image] = []
    try:
        for i, item in enumerate(items):
            opened += [open_item(data, location(modality, i, t), limits) for t, data in enumerate(item)]
        sizes = sorted({image.size for image in opened})
        if len(sizes) > 1:
            raise refuse(400, f"media need one size; got (width, height) {sizes[:5]}")
        (width, height), frames = sizes[0], len(items[0])
        total = len(items) * frames * width * height
        if total > limits.max_total_pixels:
            raise refuse(
                413, f"{total} pixels in all; this server's max_total_pixels={limits.max_total_pixels}"
            )
        media = torch.empty(len(items) * frames, 3, height, width)
        for index, image in enumerate(opened):
            try:
                media[index] = image_tensor(image)
            except Exception as error:
                where = location(modality, *divmod(index, frames))
                raise refuse(400, f"{where} cannot be decoded: {type(error).__name__}: {error}") from error
    finally:
        for image in opened:
            image.close()
    return media if modality == "image" else media.view(len(items), frames, 3, height, width)


def is_out_of_memory(error: Exception) -> bool:
    """Whether ``error`` says memory ran out (worth a retry once other work has finished)."""
    return isinstance(error, (torch.cuda.OutOfMemoryError, MemoryError)) or (
        isinstance(error, RuntimeError) and "out of memory" in str(error).lower()
    )


def run_reward(
    name: str,
    reward: Callable[..., Any],
    lock: threading.Lock,
    media: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[dict[str, Any]],
) -> dict[str, list[float]]:
    """The reward's checked scores; it is called under ``lock``, its failures become 422, 500 or 503."""
    try:
        with lock:
            output = reward(media, prompts, metadata)
        scores = checked_scores(name, output, media.shape[0])
    except RewardError as error:
        raise refuse(422, str(error)) from error
    except Exception as error:
        status = 503 if is_out_of_memory(error) else 500
        raise refuse(status, f"reward {name!r} raised {type(error).__name__}: {error}") from error
    return {key: value.tolist() for key, value in scores.items()}


def create_app(
    name: str, reward: Callable[..., Any], limits: Limits | None = None, docs: bool = False
) -> FastAPI:
    """A FastAPI app serving ``reward`` under ``name`` within ``limits`` (``Limits()`` by default).

    ``docs=True`` turns on FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json``.
    """
    limits = limits or Limits()
    app = FastAPI(
        title=f"flowrl reward server: {name}",
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
        openapi_url="/openapi.json" if docs else None,
    )
    modality = modality_of(reward)
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(limits.max_in_flight)

    def score_raw(raw: bytearray) -> dict[str, Any]:
        request = parse_request(raw)
        media = decode_items(media_items(request, name, modality, limits), modality, limits)
        metadata = request.metadata if request.metadata is not None else [{} for _ in request.prompts]
        return {"scores": run_reward(name, reward, lock, media, request.prompts, metadata)}

    @app.exception_handler(StarletteHTTPException)
    async def error_body(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=error.status_code, content={"error": error.detail})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "reward": name, "modality": modality, "protocol": PROTOCOL_VERSION}

    request_schema = {"content": {"application/json": {"schema": ScoreRequest.model_json_schema()}}}

    @app.post("/score", openapi_extra={"requestBody": request_schema})
    async def score_batch(request: Request) -> dict[str, Any]:
        if not slots.acquire(blocking=False):
            raise refuse(503, f"busy: max_in_flight={limits.max_in_flight} requests in progress; retry later")
        try:
            raw = await read_body(request, limits.max_body_bytes)
            return await run_in_threadpool(score_raw, raw)
        finally:
            slots.release()

    return app


def serve(
    name: str,
    reward: Callable[..., Any],
    host: str = "127.0.0.1",
    port: int = 8700,
    limits: Limits | None = None,
    docs: bool = False,
) -> None:
    """Run the server until interrupted (binds to loopback unless ``host`` says otherwise)."""
    import uvicorn

    uvicorn.run(create_app(name, reward, limits, docs), host=host, port=port, log_level="info")
