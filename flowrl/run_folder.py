"""The run folder's guards: a new run never writes into another run's folder, and nothing non-finite is saved."""

from __future__ import annotations

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
