"""Fake run directories for the app's tests: a tuned tiny model, a checkpoint, config and metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import yaml

from flowrl.checkpoint import write_checkpoint
from flowrl.models import ShapesDiT


def make_run(
    directory: Path,
    base_dir: Path,
    base: ShapesDiT,
    mtime: float | None = None,
    noise: float = 0.02,
    rewards: dict[str, Any] | None = None,
) -> Path:
    """A run trained from the model saved at ``base_dir``: ``model/`` (the base's weights plus ``noise``
    times Gaussian noise), a checkpoint at step 5, ``config.yaml`` (its ``rewards`` section: ``rewards``,
    by default the shapes verifier) and a ``metrics.jsonl`` with training and eval rows; ``mtime`` dates it."""
    torch.manual_seed(len(directory.name))
    tuned = ShapesDiT(base.config)
    tuned.load_state_dict(base.state_dict())
    with torch.no_grad():
        for parameter in tuned.parameters():
            parameter.add_(noise * torch.randn_like(parameter))
    tuned.save_pretrained(directory / "model")
    state = tuned.state_dict()
    write_checkpoint(directory / "checkpoints", 5, {"policy": {"model": state, "old": state}})
    config = {
        "model": {"name": str(base_dir)},
        "rewards": rewards or {"shapes_verifier": 1.0},
        "algorithm": {"name": "nft"},
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [{"step": s, "reward/mean": 0.3 + 0.05 * s, "time/elapsed": 2.0 * s} for s in range(1, 6)]
    rows.append({"step": 5, "eval/geneval/overall": 0.4, "eval/geneval/colors": 0.6})
    (directory / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if mtime is not None:
        for path in [directory, *directory.iterdir()]:
            os.utime(path, (mtime, mtime))
    return directory
