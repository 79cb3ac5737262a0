"""Atomic, verified checkpoints with a ``latest`` pointer.

A checkpoint is a directory ``step_XXXXXX/`` of ``torch.save`` files plus a
``manifest.json`` with each file's size and SHA-256 (and the run's config). It
is written under a temporary name and renamed into place (a rename is atomic),
then ``latest`` is rewritten the same way, so a killed run never leaves a half
checkpoint under a real name; a write that fails (disk full) removes its
temporary folder, and :func:`clean_temporaries` removes those a killed run
left. Reading verifies the manifest; :func:`resumable_checkpoint` refuses a
truncated or corrupted checkpoint with a clear message and falls back to the
newest older one that verifies, and is an error when checkpoints exist but none
verifies.

Nothing in a checkpoint can run code: files are read with
``torch.load(weights_only=True)`` (tensors, numbers, strings and containers
only, plus plain NumPy arrays for checkpoints of earlier versions; optimizer,
scheduler and RNG states are kept in those types), and the manifest may name
only plain file names inside its own folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

MANIFEST = "manifest.json"
LATEST = "latest"
#: the only file names a manifest may list: plain names in the checkpoint's own folder
FILE_NAME = re.compile(r"[A-Za-z0-9_-]+\.pt")
TEMPORARY_PREFIX = ".tmp-step_"
STEP_NAME = re.compile(r"step_\d+")


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


def write_checkpoint(
    directory: str | Path,
    step: int,
    payload: dict[str, Any],
    keep: int = 2,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write ``payload`` (name -> object for ``torch.save``) as checkpoint ``step``; keep the newest ``keep``.

    ``config`` (the run's config as a mapping) goes into the manifest, so that a resumed run can tell
    what changed. Pruning keeps the checkpoint just written (the one ``latest`` names) and the
    ``keep - 1`` highest steps among the others.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / step_name(step)
    temporary = directory / f"{TEMPORARY_PREFIX}{step:06d}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    with ctrl_c_deferred():
        try:
            _write_files(temporary, step, payload, config)
            if final.exists():
                shutil.rmtree(final)
            os.replace(temporary, final)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        pointer = directory / f".{LATEST}.tmp"
        pointer.write_text(final.name + "\n")
        os.replace(pointer, directory / LATEST)
        _fsync_directory(directory)
        others = [path for path in list_checkpoints(directory) if path != final]
        for old in others[: max(0, len(others) - (keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
    return final


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) that arrives inside the block and deliver it when the block ends.

    A checkpoint being written is finished first: a KeyboardInterrupt raised inside ``torch.save``
    leaves its zip writer half-closed, and the RuntimeError that writer then raises would hide the
    interrupt (the run would end with a traceback instead of the resume hint). Signals reach only the
    main thread, so elsewhere, and where SIGINT is ignored, the block runs as it is.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return
    received: list[tuple[int, FrameType | None]] = []
    signal.signal(signal.SIGINT, lambda number, frame: received.append((number, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(*received[0])  # Python's handler: raises KeyboardInterrupt
        elif received:
            signal.raise_signal(signal.SIGINT)  # SIG_DFL: the default action


def _write_files(folder: Path, step: int, payload: dict[str, Any], config: dict[str, Any] | None) -> None:
    """The payload's files and their manifest in ``folder``, each flushed to disk."""
    folder.mkdir()
    manifest: dict[str, Any] = {"step": step, "files": {}}
    for name, value in payload.items():
        path = folder / f"{name}.pt"
        if not FILE_NAME.fullmatch(path.name):
            raise ValueError(f"checkpoint entry {name!r} is not a plain name (letters, digits, _ and -)")
        with path.open("wb") as handle:
            torch.save(value, handle)
            handle.flush()
            os.fsync(handle.fileno())
        manifest["files"][path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    if config is not None:
        manifest["config"] = config
    with (folder / MANIFEST).open("w") as handle:
        handle.write(json.dumps(manifest, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_directory(folder)


def clean_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporary folders of checkpoint writes that never finished (a killed or failed run);
    returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    leftovers = sorted(path for path in directory.glob(f"{TEMPORARY_PREFIX}*") if path.is_dir())
    for path in leftovers:
        shutil.rmtree(path, ignore_errors=True)
    return leftovers


def list_checkpoints(directory: str | Path) -> list[Path]:
    """Complete-looking checkpoint directories, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(
        (path for path in directory.glob("step_*") if path.is_dir() and STEP_NAME.fullmatch(path.name)),
        key=lambda path: int(path.name.removeprefix("step_")),
    )


def verify_checkpoint(path: str | Path) -> dict[str, Any]:
    """The manifest of ``path`` after checking its form and every file's size and SHA-256;
    :class:`CheckpointError` if not."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}: it is incomplete")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is corrupted ({error})") from error
    for name, expected in _manifest_files(path, manifest).items():
        file = path / name
        if not file.is_file() or file.is_symlink():
            raise CheckpointError(f"checkpoint {path} is missing {name}")
        size = file.stat().st_size
        if size != expected["bytes"]:
            raise CheckpointError(
                f"checkpoint {path}: {name} has {size} bytes, the manifest says {expected['bytes']} (truncated)"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"checkpoint {path}: {name} does not match its SHA-256 (corrupted)")
    return manifest


def _manifest_files(path: Path, manifest: Any) -> dict[str, dict[str, Any]]:
    """The manifest's ``files``, each a plain file name with an integer size and a SHA-256 string."""
    if (
        not isinstance(manifest, dict)
        or not isinstance(manifest.get("step"), int)
        or not isinstance(manifest.get("files"), dict)
        or not manifest["files"]
    ):
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} lacks its 'step' or 'files' (corrupted)")
    for name, expected in manifest["files"].items():
        if not FILE_NAME.fullmatch(name):
            raise CheckpointError(
                f"checkpoint {path}: {MANIFEST} names the file {name!r}; only plain names such as "
                "policy.pt inside the checkpoint folder are allowed"
            )
        if not (
            isinstance(expected, dict)
            and isinstance(expected.get("bytes"), int)
            and isinstance(expected.get("sha256"), str)
        ):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST} entry of {name} lacks 'bytes' or 'sha256'")
    return manifest["files"]


def read_checkpoint(path: str | Path) -> tuple[int, dict[str, Any]]:
    """``(step, payload)`` of a verified checkpoint, read with ``weights_only=True`` (no code runs)."""
    path = Path(path)
    manifest = verify_checkpoint(path)
    payload = {name.removesuffix(".pt"): _load(path / name) for name in manifest["files"]}
    return int(manifest["step"]), payload


def _numpy_array_types() -> list[Any]:
    """What a plain NumPy array unpickles through (checkpoints written before flowrl kept RNG states as
    tensors hold NumPy's key array); object arrays still need globals that stay refused."""
    multiarray = getattr(np, "_core", None) or np.core
    return [multiarray.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _load(file: Path) -> Any:
    try:
        with torch.serialization.safe_globals(_numpy_array_types()):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"checkpoint file {file} holds objects other than tensors, numbers, strings and containers; "
            f"flowrl does not load it (it could run code): {str(error).splitlines()[0]}"
        ) from error


def checkpoint_config(path: str | Path) -> dict[str, Any] | None:
    """The run config the manifest of ``path`` records (None for checkpoints written without one). It
    reads the manifest only: call it on a checkpoint :func:`resumable_checkpoint` has verified, so that
    the files are not hashed twice."""
    try:
        config = json.loads((Path(path) / MANIFEST).read_text()).get("config")
    except (OSError, ValueError, AttributeError) as error:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable ({error})") from error
    return config if isinstance(config, dict) else None


def resumable_checkpoint(resume: str, directory: str | Path) -> Path | None:
    """The checkpoint to resume from: ``resume="latest"`` (the newest that verifies) or a path.

    A named path that fails verification is an error. ``latest`` skips bad checkpoints with a
    warning that says why; None when there is no checkpoint at all (a fresh start), and a
    :class:`CheckpointError` listing every reason when there are checkpoints but none verifies.
    """
    if resume != LATEST:
        if not Path(resume).is_dir():
            raise CheckpointError(f"resume={resume!r}: no such checkpoint directory")
        verify_checkpoint(resume)
        return Path(resume)
    directory = Path(directory)
    candidates = list_checkpoints(directory)
    pointer = directory / LATEST
    if pointer.is_file():
        named = directory / pointer.read_text(errors="replace").strip()
        if named in candidates:  # the pointer names a real checkpoint of this folder: it is tried first
            candidates = [c for c in candidates if c != named] + [named]
    reasons = []
    for candidate in reversed(candidates):
        try:
            verify_checkpoint(candidate)
        except CheckpointError as error:
            reasons.append(str(error))
            continue
        for reason in reasons:
            warnings.warn(f"skipping unusable checkpoint: {reason}", stacklevel=2)
        return candidate
    if reasons:
        raise CheckpointError(
            f"resume=latest: none of the {len(reasons)} checkpoints in {directory} is usable: "
            + "; ".join(reasons)
        )
    return None
