"""The reference reward server: serves any registered reward over the protocol of ``rewards.remote``.

    flowrl reward-server --reward clip_score --port 8700 --setting model_name=ViT-B-32

Built on FastAPI and uvicorn. ``/score`` is a plain (sync) endpoint, so
FastAPI runs it in its worker threads and the event loop keeps answering
``/health`` while a batch is scored; a lock scores requests one at a time
(the reward's models need not be thread-safe). Answers:

  - 400: the request is malformed or carries the wrong modality;
  - 422: the reward broke its contract (NaN, wrong shape, bad media), the
    same boundary check as in-process scoring; retrying cannot help;
  - 503: the reward raised (e.g. out of memory); the client may retry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewards.base import RewardError, check_media, checked_scores, modality_of
from rewards.remote import PROTOCOL_VERSION, decode_media


def create_app(name: str, reward: Callable[..., Any]) -> FastAPI:
    """A FastAPI app serving ``reward`` under ``name``."""
    app = FastAPI(title=f"flowrl reward server: {name}")
    modality = modality_of(reward)
    lock = threading.Lock()

    @app.exception_handler(StarletteHTTPException)
    async def error_body(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=error.status_code, content={"error": error.detail})

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"error": f"bad request: {error.errors()}"})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "reward": name, "modality": modality, "protocol": PROTOCOL_VERSION}

    @app.post("/score")
    def score_batch(body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        try:
            media, sent_modality = decode_media(body)
            prompts = list(body["prompts"])
            metadata = list(body.get("metadata") or [{}] * len(prompts))
        except Exception as error:
            raise HTTPException(
                status_code=400, detail=f"bad request: {type(error).__name__}: {error}"
            ) from error
        if sent_modality != modality:
            raise HTTPException(
                status_code=400, detail=f"reward {name!r} takes {modality} media, got {sent_modality}"
            )
        if not len(prompts) == len(metadata) == media.shape[0]:
            raise HTTPException(
                status_code=400,
                detail=f"{media.shape[0]} media, {len(prompts)} prompts and {len(metadata)} metadata entries",
            )
        try:
            check_media(name, media, modality)
            with lock:
                try:
                    output = reward(media, prompts, metadata)
                except RewardError:
                    raise
                except Exception as error:
                    raise HTTPException(
                        status_code=503, detail=f"reward {name!r} raised {type(error).__name__}: {error}"
                    ) from error
            scores = checked_scores(name, output, media.shape[0])
        except RewardError as error:
            raise HTTPException(status_code=422, detail=str(error)) from error
        return {"scores": {key: value.tolist() for key, value in scores.items()}}

    return app


def serve(name: str, reward: Callable[..., Any], host: str = "127.0.0.1", port: int = 8700) -> None:
    """Run the server until interrupted (binds to loopback unless ``host`` says otherwise)."""
    import uvicorn

    uvicorn.run(create_app(name, reward), host=host, port=port, log_level="info")
