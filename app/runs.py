"""Runs, checkpoints and models as the app offers them: finding runs, loading a tuned model, reading a run.

A *source* is what the app can load as a model: a shipped model name
(``shapes-base``), a model directory (``config.json`` + weights, such as a
run's ``model/``), a run directory (its ``model/``, or its newest checkpoint
while it has none yet) or a checkpoint directory ``checkpoints/step_XXXXXX``.

The app loads only what it offers (a :class:`Catalog`): the runs under its
runs root and their checkpoints, and the models named on its command line.
A run with any entry that leads outside the root through a symlink is not offered, and a checkpoint
loads only on an offered base model's architecture.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flowrl.checkpoint import MANIFEST, list_checkpoints, read_checkpoint, resumable_checkpoint
from flowrl.models import DEFAULT_BASE, SHIPPED_MODELS, ShapesDiT, load_shapes_model
from flowrl.models.shapes_dit import CONFIG_NAME, ShapesDiTConfig, read_model_config
from flowrl.yaml_reading import MAX_YAML_CHARS, parse_yaml

#: The reward a run without a readable ``config.yaml`` is scored with (the trainer's default).
DEFAULT_REWARDS: dict[str, Any] = {"shapes_verifier": 1.0}


def _modified(path: Path) -> float:
    """Newest modification time of ``path`` and its direct children."""
    return max([path.stat().st_mtime] + [child.stat().st_mtime for child in path.iterdir()])


def is_run(path: Path) -> bool:
    """Whether ``path`` is a run directory of an image model with a tuned model or a checkpoint to load
    (the app shows images; runs of the video world are left out)."""
    has_model = (path / "model" / CONFIG_NAME).is_file() or bool(list_checkpoints(path / "checkpoints"))
    return has_model and not is_video_run(path)


def is_video_run(path: Path) -> bool:
    """Whether a run trained a video model: its saved model has ``num_frames > 1``, or it trained on the
    video world's prompts. Its ``model/config.json`` is checked in full (fields, bounds, parameter count),
    so a model the app could not load is reported when the runs are listed, not when it is asked for."""
    model_config = path / "model" / CONFIG_NAME
    if model_config.is_file():
        status = model_config.stat()
        if checked_model_config(model_config, status.st_mtime_ns, status.st_size).num_frames > 1:
            return True
    return run_config(path).get("data", {}).get("prompts") == "video-shapes-train"


@functools.lru_cache(maxsize=256)
def checked_model_config(path: Path, modified_ns: int, size: int) -> ShapesDiTConfig:
    """``read_model_config(path)`` with its message relative to the run, cached while the file is unchanged
    (the runs are listed at every call)."""
    try:
        return read_model_config(path)
    except (ValueError, TypeError) as error:
        message = str(error).replace(str(path), f"model/{CONFIG_NAME}")
        raise ValueError(message) from None


def _inside(path: Path, root: Path) -> bool:
    """Whether ``path`` lies inside ``root`` once the symlinks of both are resolved."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        return False


def is_confined(run: Path, root: Path) -> bool:
    """Whether ``run`` and every entry in it, at any depth (so every file the app may read of it: its model,
    config, metrics and checkpoints), stay inside ``root`` once symlinks are resolved. Symlinked folders are
    checked, not descended into: one inside the root is walked as itself, one outside excludes the run."""
    if not _inside(run, root):
        return False
    for folder, folders, files in os.walk(run):
        entries = [Path(folder) / name for name in (*folders, *files)]
        if not all(_inside(entry, root) for entry in entries):
            return False
    return True


def find_runs(root: str | Path) -> list[Path]:
    """Run directories directly under ``root`` that hold a model or a checkpoint, newest first; a run that
    leads outside ``root`` through a symlink, or whose files cannot be read, is left out (see
    :func:`survey_runs`)."""
    return survey_runs(root)[0]


def left_out_runs(root: str | Path) -> list[tuple[str, str]]:
    """The folders directly under ``root`` that hold a run the app does not offer, each with its one-line
    reason (see :func:`survey_runs`)."""
    return survey_runs(root)[1]


def survey_runs(root: str | Path) -> tuple[list[Path], list[tuple[str, str]]]:
    """``(offered, left_out)`` of the folders directly under ``root``: the readable, confined runs (newest
    first), and the folders that look like runs (a ``model``, ``checkpoints`` or ``config.yaml``) but are not
    offered, by name with the one-line reason (a file leading outside the runs folder, an unreadable config
    or model). Each folder is read in isolation: one bad run never hides the others."""
    root = Path(root)
    if not root.is_dir():
        return [], []
    offered, left_out = [], []
    for path in sorted(root.iterdir()):
        if not path.is_dir():
            continue
        looks_like_run = any((path / name).exists() for name in ("model", "checkpoints", "config.yaml"))
        if not is_confined(path, root):
            if looks_like_run:
                left_out.append((path.name, "a file in it leads outside the runs folder"))
            continue
        try:
            if is_run(path):
                offered.append(path)
        except (ValueError, OSError) as error:
            reason = " ".join(str(error).split())
            left_out.append((path.name, reason if len(reason) <= 200 else reason[:197] + "..."))
    return sorted(offered, key=_modified, reverse=True), left_out


def source_choices(root: str | Path) -> list[str]:
    """What the tuned-model selector lists: each run, newest first, followed by its checkpoints (newest first)."""
    choices = []
    for run in find_runs(root):
        choices.append(str(run))
        choices.extend(str(checkpoint) for checkpoint in reversed(list_checkpoints(run / "checkpoints")))
    return choices


def run_dir_of(source: str | Path) -> Path | None:
    """The run directory a source belongs to (for its metrics and reward), or None (shipped or loose model)."""
    path = Path(source)
    for candidate in (path, path.parent, path.parent.parent):
        if (candidate / "metrics.jsonl").is_file() or (candidate / "config.yaml").is_file():
            return candidate
    return None


def run_config(run_dir: Path | None) -> dict[str, Any]:
    """The run's ``config.yaml`` as a mapping (empty when there is none), read as flowrl reads configs:
    bounded (:func:`flowrl.config.parse_yaml`: no aliases, a size and a depth cap); a ``ValueError`` in one
    line when it is malformed or refused."""
    path = None if run_dir is None else run_dir / "config.yaml"
    if path is None or not path.is_file():
        return {}
    with path.open(encoding="utf-8", errors="replace") as handle:
        text = handle.read(MAX_YAML_CHARS + 1)  # never more than the parser accepts, whatever the file's size
    data = parse_yaml(text, f"the run's config.yaml ({run_dir.name})") or {}
    if not isinstance(data, dict):
        raise ValueError(f"the run's config.yaml ({run_dir.name}) holds {type(data).__name__}, not a mapping")
    return data


def reward_spec(run_dir: Path | None) -> dict[str, Any]:
    """The ``rewards`` section the run trained with, :data:`DEFAULT_REWARDS` otherwise."""
    return run_config(run_dir).get("rewards") or dict(DEFAULT_REWARDS)


@dataclass(frozen=True)
class Catalog:
    """What the app offers, and so all it loads: the runs under ``root`` with their checkpoints, and the
    base and tuned models named on the command line (chosen by whoever started the app).

    The runs are listed afresh at every call, and a submitted value is
    accepted only when it is one of the offered strings, exactly: a request
    can send any string, whatever the page's dropdowns offer.
    """

    root: Path = Path("runs")
    base: str = DEFAULT_BASE
    tuned: str | None = None

    def tuned_choices(self) -> list[str]:
        """The command line's tuned model, then every run and checkpoint under the root, newest first."""
        named = [self.tuned] if self.tuned else []
        return list(dict.fromkeys([*named, *source_choices(self.root)]))

    def base_choices(self) -> list[str]:
        """The command line's base model, then the shipped models."""
        return list(dict.fromkeys([self.base, *SHIPPED_MODELS]))

    def checked_tuned(self, source: object) -> str:
        """``source`` if it is an offered tuned source; ``ValueError`` otherwise (not naming it)."""
        if not isinstance(source, str) or source not in self.tuned_choices():
            raise ValueError(
                f"That is not one of the offered runs or checkpoints (the runs under {self.root}/); "
                "pick one from the list."
            )
        return source

    def run_base(self, source: object) -> str | None:
        """The base model the run of an offered tuned ``source`` was trained from (its ``config.yaml``'s
        ``model.name``) when the app offers it; ``None`` otherwise (not offered, no run, no or a malformed
        config), so that base and tuned are compared on the same base by default."""
        try:
            model = run_config(self.run_dir(self.checked_tuned(source))).get("model")
        except ValueError:
            return None
        name = model.get("name") if isinstance(model, dict) else None
        return name if name in self.base_choices() else None

    def checked_base(self, source: object) -> str:
        """``source`` if it is an offered base model; ``ValueError`` otherwise (not naming it)."""
        if not isinstance(source, str) or source not in self.base_choices():
            raise ValueError(
                f"That is not one of the offered base models; choose one of {self.base_choices()}."
            )
        return source

    def run_dir(self, source: str) -> Path | None:
        """The run an offered source belongs to: for a run or checkpoint under the root, its run folder
        there (never a folder above it); for a model named on the command line, what :func:`run_dir_of` finds."""
        if source in source_choices(self.root):
            return self.root / Path(source).relative_to(self.root).parts[0]
        return run_dir_of(source)


def _from_checkpoint(checkpoint: Path, base: str) -> ShapesDiT:
    """The tuned network of a checkpoint (EMA when kept), on the architecture of its run's base model, which
    must be one the app offers (``base``, the offered base model, or a shipped one): a run's config.yaml
    does not choose what the app reads."""
    run_dir = run_dir_of(checkpoint)
    name = run_config(run_dir).get("model", {}).get("name", base)
    if name not in (base, *SHIPPED_MODELS):
        raise ValueError(
            "This run's config.yaml names a base model the app does not offer (neither a shipped model nor the "
            "selected base); start the app with that model as --base to load its checkpoints."
        )
    model = load_shapes_model(name)
    _, payload = read_checkpoint(checkpoint)
    policy = payload["policy"]
    model.load_state_dict(policy["ema"] if "ema" in policy else policy["model"])
    return model


def _resolve(source: str, base: str) -> ShapesDiT:
    if source in SHIPPED_MODELS:
        return load_shapes_model(source)
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"no model, run or checkpoint at {source!r}")
    if (path / CONFIG_NAME).is_file():
        return load_shapes_model(str(path))
    if (path / "model" / CONFIG_NAME).is_file():
        return load_shapes_model(str(path / "model"))
    if (path / MANIFEST).is_file():
        return _from_checkpoint(path, base)
    latest = resumable_checkpoint("latest", path / "checkpoints")
    if latest is not None:
        return _from_checkpoint(latest, base)
    raise FileNotFoundError(
        f"{source!r} is neither a shipped model {sorted(SHIPPED_MODELS)}, a model directory, "
        "a run directory with model/ or checkpoints/, nor a checkpoint directory"
    )


@functools.lru_cache(maxsize=4)
def _cached(source: str, base: str, stamp: float, device: str) -> ShapesDiT:
    return _resolve(source, base).to(device).eval()


def load_model(source: str, base: str = DEFAULT_BASE, device: str | torch.device = "cpu") -> ShapesDiT:
    """The model of a source (see module docstring), cached until the source changes on disk.

    ``base`` names the architecture of a checkpoint whose run has no ``config.yaml``.
    """
    path = Path(source)
    stamp = _modified(path) if source not in SHIPPED_MODELS and path.is_dir() else 0.0
    return _cached(source, base, stamp, str(device))
