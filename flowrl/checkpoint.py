"""Atomic, verified checkpoints with a ``latest`` pointer.

A checkpoint is a directory ``step_XXXXXX/`` of ``torch.save`` files plus a
``manifest.json`` with each file's size and SHA-256. It is written under a
temporary name and renamed into place (a rename is atomic), then ``latest``
is rewritten the same way, so a killed run never leaves a half checkpoint
under a real name. Reading verifies the manifest; :func:`resumable_checkpoint`
refuses a truncated or corrupted checkpoint with a clear message and falls
back to the newest older one that verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
LATEST = "latest"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (missing, truncated, corrupted)."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def write_checkpoint(directory: str | Path, step: int, payload: dict[str, Any], keep: int = 2) -> Path:
    """Write ``payload`` (name -> object for ``torch.save``) as checkpoint ``step``; keep the newest ``keep``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / step_name(step)
    temporary = directory / f".tmp-{step_name(step)}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    manifest: dict[str, Any] = {"step": step, "files": {}}
    for name, value in payload.items():
        path = temporary / f"{name}.pt"
        with path.open("wb") as handle:
            torch.save(value, handle)
            handle.flush()
            os.fsync(handle.fileno())
        manifest["files"][path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    (temporary / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    _fsync_directory(temporary)
    if final.exists():
        shutil.rmtree(final)
    os.replace(temporary, final)
    pointer = directory / f".{LATEST}.tmp"
    pointer.write_text(final.name + "\n")
    os.replace(pointer, directory / LATEST)
    _fsync_directory(directory)
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.glob("step_*") if path.is_dir())


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """The manifest of ``path`` after checking every file's size and SHA-256; :class:`CheckpointError` if not."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}: it is incomplete")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is corrupted ({error})") from error
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} has {size} bytes, the manifest says {expected['bytes']} (truncated)"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its SHA-256 (corrupted)")
    return manifest


def read_checkpoint(path: str | Path) -> tuple[int, dict[str, Any]]:
    """``(step, payload)`` of a verified checkpoint."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    payload = {
        name.removesuffix(".pt"): torch.load(path / name, map_location="cpu", weights_only=False)
        for name in manifest["files"]
    }
    return int(manifest["step"]), payload


def resumable_checkpoint(resume: str, directory: str | Path) -> Path | None:
    """The checkpoint to resume from: ``resume="latest"`` (newest that verifies, None if none) or a path.

    A named path that fails verification is an error; ``latest`` skips bad
    checkpoints with a warning that says why.
    """
    if resume != LATEST:
        verify_checkpoint(resume)
        return Path(resume)
    directory = Path(directory)
    candidates = list_checkpoints(directory)
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text().strip()
        candidates = [c for c in candidates if c != named] + ([named] if named.is_dir() else [])
    for candidate in reversed(candidates):
        try:
            verify_checkpoint(candidate)
        except CheckpointError as error:
            warnings.warn(f"skipping unusable checkpoint: {error}", stacklevel=2)
            continue
        return candidate
    return None
