"""The run folder's guards: one live run per folder (an OS lock held for the run's life), a new run never writes
into another run's folder, a resumed run never changes what it was trained with, and nothing non-finite is
saved."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import socket
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import torch

from flowrl.config_schema import ConfigError

#: what a run writes into its folder; any of them means the folder holds a run
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "model")


#: the run folder's lock file: ``flock``-ed by the live run (the OS drops the lock when its process ends, however
#: it ends), holding the holder's pid and host for the refusal's message
LOCK_FILE = ".flowrl.lock"


def claim_output_dir(output_dir: Path, resume: str | None) -> IO[str]:
    """Claim ``logging.output_dir`` before anything loads or is written: a folder (or nothing yet) that can be
    written, locked by no live run, and, unless the run resumes, holding no run (whose history the new run
    would mix with its own; checked under the lock, so two runs started at once cannot both pass). Returns
    the lock file, open: the run holds the folder until it closes it (or its process ends)."""
    name = f"logging.output_dir={str(output_dir)!r}"
    if resume and resume != "latest" and not Path(resume).is_dir():
        raise ConfigError(f"resume={resume!r}: no such checkpoint directory; name one, or resume=latest")
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"{name} is a file, not a folder; choose a folder for the run")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as error:
        raise ConfigError(f"{name} cannot be written: {error.strerror or error}") from None
    lock = lock_run_folder(output_dir)
    existing = [entry for entry in RUN_FILES if (output_dir / entry).exists()]
    if existing and not resume:
        lock.close()
        raise ConfigError(
            f"{name} already holds a run ({', '.join(existing)}); continue it with resume=latest, or give "
            "the new run its own logging.output_dir"
        )
    return lock


def lock_run_folder(output_dir: Path) -> IO[str]:
    """Take ``output_dir``'s lock (``fcntl.flock``, exclusive, not waiting) and write this process's pid and
    host into it; a one-line :class:`ConfigError` naming the holder when a live process has it."""
    handle = open(output_dir / LOCK_FILE, "a+", encoding="utf-8")  # created if missing, never truncated here
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read(200).strip() or "a process that has not written its pid yet"
        handle.close()
        raise ConfigError(
            f"logging.output_dir={str(output_dir)!r} is in use by a live flowrl run ({holder}); wait for it to "
            "end, or give this run its own logging.output_dir"
        ) from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    return handle


def non_finite_tensors(state: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The names of the tensors in a (nested) state dict that hold NaN or infinite values."""
    bad = []
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            bad.extend(non_finite_tensors(value, f"{name}."))
        elif (
            isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()
        ):
            bad.append(name)
    return bad


def refuse_non_finite(state: Mapping[str, Any], what: str, step: int) -> None:
    """A ``FloatingPointError`` naming the tensors of ``state`` that hold NaN or infinite values, if any:
    no checkpoint or model of a non-finite network is ever saved."""
    bad = non_finite_tensors(state)
    if bad:
        raise FloatingPointError(
            f"not saving the {what} at step {step}: non-finite values in {bad[:5]}"
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        )


#: keys a resumed run may change: how long it runs and how it reports; any other change (the learning
#: rate, the reward, the algorithm, ...) would mix two runs' histories in one folder and is refused
RESUME_MUTABLE_KEYS = (
    "resume",
    "training.steps",
    "training.threads",
    "training.max_consecutive_skips",
    "logging.output_dir",
    "logging.tracker",
    "logging.progress",
    "logging.sample_every",
    "logging.checkpoint_every",
    "logging.keep_checkpoints",
    "evaluation.every",
)


#: the key of the run record (beside the config's sections) that holds :func:`input_fingerprints`
INPUTS_KEY = "inputs"


def input_fingerprints(prompts: str, model_name: str) -> dict[str, str]:
    """``sha256:<hex>`` of the content of every input the run reads by path: ``data.prompts`` when it is a
    file, ``model.name`` when it is a local directory (its files by relative path, symlinks followed).
    Shipped names (``shapes-train``, ``shapes-base``) change only with the package, whose version the run
    records; hub ids are not local."""
    fingerprints = {}
    if Path(prompts).is_file():
        fingerprints["data.prompts"] = _file_digest(Path(prompts))
    if Path(model_name).is_dir():
        digest = hashlib.sha256()
        root = Path(model_name)
        for path in sorted(path for path in root.rglob("*") if path.is_file()):
            digest.update(f"{path.relative_to(root).as_posix()}\0{_file_digest(path)}\0".encode())
        fingerprints["model.name"] = f"sha256:{digest.hexdigest()}"
    return fingerprints


def _file_digest(path: Path) -> str:
    with path.open("rb") as handle:
        return f"sha256:{hashlib.file_digest(handle, 'sha256').hexdigest()}"


def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and key != "rewards":
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resume_changes(saved: dict[str, Any], config: dict[str, Any], checkpoint: str) -> None:
    """Refuse to resume ``checkpoint`` (whose manifest recorded ``saved``) under a ``config`` (as a plain
    mapping, with the inputs' fingerprints under :data:`INPUTS_KEY`) that changed anything but
    :data:`RESUME_MUTABLE_KEYS`, or whose inputs' contents changed at the same path; the error lists each
    change. A checkpoint written before fingerprints were recorded is not checked for them."""
    saved_inputs = saved.get(INPUTS_KEY)
    inputs = config.get(INPUTS_KEY) or {}
    if isinstance(saved_inputs, dict):
        changed_inputs = [
            f"{key}={config_value(config, key)!r}"
            for key in sorted(set(saved_inputs) | set(inputs))
            if saved_inputs.get(key) != inputs.get(key)
        ]
        if changed_inputs:
            raise ConfigError(
                f"resume: the content of {', '.join(changed_inputs)} changed since checkpoint {checkpoint} was "
                "written (its sha256 differs); restore it, or start a new run in another logging.output_dir"
            )
    config = {key: value for key, value in config.items() if key != INPUTS_KEY}
    saved = {key: value for key, value in saved.items() if key != INPUTS_KEY}
    current = _flatten(json.loads(json.dumps(config)))
    before = _flatten(saved)
    changed = [
        f"{key}: {before.get(key)!r} -> {current.get(key)!r}"
        for key in sorted(set(current) | set(before))
        if key not in RESUME_MUTABLE_KEYS and before.get(key) != current.get(key)
    ]
    if changed:
        raise ConfigError(
            f"resume: the config differs from the one checkpoint {checkpoint} was trained with "
            f"({'; '.join(changed)}); a resumed run may change only {list(RESUME_MUTABLE_KEYS)}. "
            "Undo the change, or start a new run in another logging.output_dir"
        )


def config_value(config: dict[str, Any], dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` (None where a key is missing)."""
    value: Any = config
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


#: the packages whose versions a run records in its config.yaml
PACKAGES = ("flowrl", "torch", "diffusers", "accelerate", "peft", "transformers", "open-clip-torch")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a run depends on."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
