"""The run folder's guards: a new run never writes into another run's folder, a resumed run never changes what
it was trained with, and nothing non-finite is saved."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flowrl.config_schema import ConfigError

#: what a run writes into its folder; any of them means the folder holds a run
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "model")


def check_output_dir(output_dir: Path, resume: str | None) -> None:
    """Check ``logging.output_dir`` before anything loads: a folder (or nothing yet) that can be written,
    and, unless the run resumes, one that holds no run (whose history the new run would mix with its own)."""
    name = f"logging.output_dir={str(output_dir)!r}"
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"{name} is a file, not a folder; choose a folder for the run")
    existing = [entry for entry in RUN_FILES if (output_dir / entry).exists()]
    if existing and not resume:
        raise ConfigError(
            f"{name} already holds a run ({', '.join(existing)}); continue it with resume=latest, or give "
            "the new run its own logging.output_dir"
        )
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=output_dir):
            pass
    except OSError as error:
        raise ConfigError(f"{name} cannot be written: {error.strerror or error}") from None


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
    mapping) that changed anything but :data:`RESUME_MUTABLE_KEYS`; the error lists each change."""
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
