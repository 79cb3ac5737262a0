"""The reference reward server: serves any registered reward over the protocol of ``rewards.remote``.

    flowrl reward-server --reward clip_score --port 8700 --setting model_name=ViT-B-32

Built on FastAPI and uvicorn. Requests are scored one at a time (a lock
guards the reward, whose models need not be thread-safe); every answer
passes the same boundary check as in-process scoring.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rewards.base import RewardError, modality_of, score
from rewards.remote import PROTOCOL_VERSION, decode_media


def create_app(name: str, reward: Callable[..., Any]) -> FastAPI:
    """A FastAPI app serving ``reward`` under ``name``."""
    app = FastAPI(title=f"flowrl reward server: {name}")
    modality = modality_of(reward)
    lock = threading.Lock()

    @app.exception_handler(StarletteHTTPException)
    async def error_body(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=error.status_code, content={"error": error.detail})

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "reward": name, "modality": modality, "protocol": PROTOCOL_VERSION}

    @app.post("/score")
    async def score_batch(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
            media, sent_modality = decode_media(body)
            prompts, metadata = (
                list(body["prompts"]),
                list(body.get("metadata") or [{}] * len(body["prompts"])),
            )
        except Exception as error:
            raise HTTPException(
                status_code=400, detail=f"bad request: {type(error).__name__}: {error}"
            ) from error
        if sent_modality != modality:
            raise HTTPException(
                status_code=400, detail=f"reward {name!r} takes {modality} media, got {sent_modality}"
            )
        try:
            with lock:
                scores = score(name, reward, media, prompts, metadata)
        except RewardError as error:
            raise HTTPException(status_code=500, detail=str(error)) from error
        return {"scores": {key: value.tolist() for key, value in scores.items()}}

    return app


def serve(name: str, reward: Callable[..., Any], host: str = "127.0.0.1", port: int = 8700) -> None:
    """Run the server until interrupted (binds to loopback unless ``host`` says otherwise)."""
    import uvicorn

    uvicorn.run(create_app(name, reward), host=host, port=port, log_level="info")
