"""What a run writes as it goes: ``metrics.jsonl``, reward and eval curves (PNG), captioned sample grids."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageSequence

from flowrl.grid import save_grid


class MetricsLog:
    """Appends one JSON object per step to ``metrics.jsonl`` (flushed, so a killed run keeps its lines)."""

    def __init__(self, path: str | Path, resume_step: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows = [row for row in read_metrics(self.path) if row["step"] <= resume_step]
        self._rewrite()

    def _rewrite(self) -> None:
        self.path.write_text("".join(json.dumps(row) + "\n" for row in self.rows))

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (a partial last line from a killed run is dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def plot_curves(
    rows: Sequence[dict[str, Any]], path: str | Path, title: str = "", score_prefix: str = "geneval"
) -> Path:
    """Reward vs step, reward vs wall-clock seconds, and held-out eval scores vs step (``eval/<score_prefix>/*``,
    ``geneval`` for images, ``videoeval`` for clips), in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    train = [row for row in rows if "reward/mean" in row]
    prefix = f"eval/{score_prefix}"
    evals = [row for row in rows if f"{prefix}/overall" in row]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4))
    steps = [row["step"] for row in train]
    rewards = [row["reward/mean"] for row in train]
    axes[0].plot(steps, rewards, color="tab:blue", alpha=0.4, label="per step")
    axes[0].plot(steps, _smooth(rewards), color="tab:blue", label="smoothed")
    axes[0].set(xlabel="step", ylabel="training reward (mean)", title="reward vs step")
    axes[0].legend()
    axes[1].plot([row["time/elapsed"] for row in train], _smooth(rewards), color="tab:orange")
    axes[1].set(xlabel="wall-clock seconds", ylabel="training reward (smoothed)", title="reward vs time")
    if evals:
        axes[2].plot(
            [r["step"] for r in evals], [r[f"{prefix}/overall"] for r in evals], "o-", label="overall"
        )
        tasks = sorted(key.removeprefix(f"{prefix}/") for key in evals[-1] if key.startswith(f"{prefix}/"))
        for task in tasks:
            if task != "overall":
                axes[2].plot(
                    [r["step"] for r in evals],
                    [r[f"{prefix}/{task}"] for r in evals],
                    alpha=0.5,
                    label=task,
                )
        axes[2].legend(fontsize=7)
    axes[2].set(xlabel="step", ylabel="held-out score (CFG-free)", title="evaluation", ylim=(0, 1))
    for axis in axes:
        axis.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _smooth(values: Sequence[float], window: int = 10) -> list[float]:
    """Trailing mean over ``window`` values."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / (i - max(0, i - window + 1) + 1)
        for i in range(len(values))
    ]


def save_sample_grid(
    path: str | Path, images: torch.Tensor, prompts: Sequence[str], rewards: torch.Tensor, columns: int = 8
) -> Path:
    """A grid of training samples captioned with their prompt and reward (an animated GIF for clips)."""
    captions = [f"{prompt} | r={reward:.2f}" for prompt, reward in zip(prompts, rewards.tolist())]
    return save_grid(path, images, captions, columns)


def log_grid_to_trackers(accelerator: Any, name: str, path: Path, step: int) -> None:
    """Send a saved grid to the run's trackers: wandb gets the image, or the animated GIF as a video;
    TensorBoard gets the image, or for a GIF its frames side by side (TensorBoard's own video panel
    needs moviepy, which flowrl does not install)."""
    for tracker in accelerator.trackers:
        if tracker.name == "wandb":
            import wandb

            media = wandb.Video(str(path), format="gif") if path.suffix == ".gif" else wandb.Image(str(path))
            tracker.log({name: media}, step=step)
        elif tracker.name == "tensorboard":
            tracker.writer.add_image(name, grid_pixels(path), step, dataformats="HWC")


#: the most frames of an animated grid :func:`grid_pixels` puts side by side
MAX_STRIP_FRAMES = 8


def grid_pixels(path: Path) -> np.ndarray:
    """The ``[H, W, 3]`` uint8 pixels of a saved grid; for an animated grid, up to ``MAX_STRIP_FRAMES``
    evenly spaced frames side by side."""
    with Image.open(path) as image:
        frames = [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)]
    keep = np.unique(np.linspace(0, len(frames) - 1, min(len(frames), MAX_STRIP_FRAMES)).round().astype(int))
    return np.concatenate([frames[index] for index in keep], axis=1)
