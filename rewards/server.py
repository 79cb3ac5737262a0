"""The reference reward server: serves any registered reward over the protocol of ``rewards.remote``.

    flowrl reward-server --reward clip_score --port 8700 --setting model_name=ViT-B-32

Built on FastAPI and uvicorn (with :mod:`rewards.server_protocol`'s header deadline and connection cap).
``/score`` reads the body itself, counting bytes against the request's and the server's limits and a
deadline, then parses, validates and decodes it in a worker thread, so the event loop keeps answering
``/health`` while a batch is scored. A request takes a slot (``max_in_flight``) only once its body has
arrived, so slow senders hold no slot; at most ``max_decoded`` requests hold decoded media; a lock scores
requests one at a time (the reward's models need not be thread-safe). Answers:

  - 400: the request is malformed (not JSON, wrong types, lengths that
    differ, media that are not PNG) or carries the wrong modality; the
    reward is never called;
  - 408: the body did not arrive within ``body_timeout_s``;
  - 413: the request is over one of the :class:`Limits` (checked on the
    Content-Length header, on the bytes as they arrive, then on the PNG
    headers, before any pixel is decoded);
  - 422: the reward broke its contract (NaN, wrong shape), the same
    boundary check as in-process scoring, or raised a ``RewardError``;
  - 500: the reward raised anything else; retrying cannot help;
  - 503: the reward ran out of memory, ``max_in_flight`` requests are in
    progress or ``max_buffered_bytes`` of bodies are held; the client may retry.

Error messages are at most a few hundred characters and never echo the
request. FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are off unless
``docs=True``. Memory is bounded by :func:`rewards.server_limits.memory_bound`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewards.base import RewardError, checked_scores, modality_of
from rewards.remote import PROTOCOL_VERSION
from rewards.server_limits import Limits
from rewards.server_media import ScoreRequest, decode_items, media_items, media_size, refuse
from rewards.server_protocol import raise_open_file_limit, server_config

__all__ = ["Limits", "create_app", "serve"]

#: the bytes of a body that open a JSON value or separate two (``max_json_values`` counts them)
JSON_STRUCTURE = (b",", b":", b"[", b"{")


class BodyPool:
    """Bytes of request bodies held at once, against ``max_buffered_bytes``: a body counts from its first
    byte until its answer is sent (parsed, its strings take the place of its bytes). Used on the event
    loop only, so it needs no lock."""

    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0

    def take(self, size: int) -> None:
        if self.held + size > self.limit:
            raise refuse(503, f"busy: max_buffered_bytes={self.limit} of request bodies held; retry later")
        self.held += size


class Body:
    """One request's body as it arrives, counted in its server's :class:`BodyPool` until released."""

    def __init__(self, pool: BodyPool) -> None:
        self.pool, self.data, self.counted = pool, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.pool.take(len(chunk))
        self.counted += len(chunk)
        self.data += chunk

    def take_data(self) -> bytearray:
        """The bytes, handed over (to be parsed and freed); they stay counted until :meth:`release`."""
        data, self.data = self.data, bytearray()
        return data

    def release(self) -> None:
        self.pool.held -= self.counted
        self.counted = 0


def validation_message(error: ValidationError) -> str:
    """Where and what is wrong in a request, without the input itself."""
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_context=False, include_input=False)[:3]
    ]
    more = error.error_count() - len(problems)
    return "bad request: " + "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")


async def read_body(request: Request, limits: Limits, body: Body) -> None:
    """Read the request's body into ``body``: 413 as soon as its declared or received size is over
    ``max_body_bytes``, 503 when the server holds ``max_buffered_bytes`` of bodies, 408 when it has not
    all arrived ``body_timeout_s`` after its headers."""
    declared = request.headers.get("content-length")
    if declared is not None and int(declared) > limits.max_body_bytes:
        raise refuse(
            413, f"body of {declared} bytes is over this server's max_body_bytes={limits.max_body_bytes}"
        )
    try:
        async with asyncio.timeout(limits.body_timeout_s):
            async for chunk in request.stream():
                if len(body.data) + len(chunk) > limits.max_body_bytes:
                    raise refuse(413, f"body is over this server's max_body_bytes={limits.max_body_bytes}")
                body.add(chunk)
    except TimeoutError as error:
        raise refuse(
            408, f"body not received within this server's body_timeout_s={limits.body_timeout_s:g}"
        ) from error


def parse_request(raw: bytearray, limits: Limits) -> ScoreRequest:
    """The validated request: 413 if it holds more than ``max_json_values`` values (counted on the raw
    bytes before parsing), 400 naming what is wrong if it is malformed."""
    values = sum(raw.count(mark) for mark in JSON_STRUCTURE)
    if values > limits.max_json_values:
        raise refuse(
            413,
            f"{values} commas, colons and opening brackets; this server's max_json_values={limits.max_json_values}",
        )
    try:
        return ScoreRequest.model_validate_json(raw)
    except ValidationError as error:
        raise refuse(400, validation_message(error)) from error


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
    decoded = threading.BoundedSemaphore(limits.max_decoded)
    pool = BodyPool(limits.max_buffered_bytes)

    def score_body(body: Body) -> dict[str, Any]:
        request = parse_request(body.take_data(), limits)
        items = media_items(request, name, modality, limits)
        size = media_size(items, modality, limits)
        metadata = request.metadata if request.metadata is not None else [{} for _ in request.prompts]
        with decoded:
            media = decode_items(items, modality, size)
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
        body = Body(pool)
        try:
            await read_body(request, limits, body)
            if not slots.acquire(blocking=False):
                raise refuse(
                    503, f"busy: max_in_flight={limits.max_in_flight} requests in progress; retry later"
                )
            try:
                return await run_in_threadpool(score_body, body)
            finally:
                slots.release()
        finally:
            body.release()

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
    limits = limits or Limits()
    raise_open_file_limit(limits.max_connections)
    app = create_app(name, reward, limits, docs)
    uvicorn.Server(server_config(app, limits, host=host, port=port, log_level="info")).run()
