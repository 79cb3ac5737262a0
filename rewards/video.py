"""Video rewards: any image reward averaged over sampled frames, and temporal consistency.

Videos are ``[B, T, 3, H, W]`` in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rewards import weights
from rewards.base import score
from rewards.clip_models import clip_preprocess, image_size_of, load_open_clip
from rewards.registry import build_reward


def frame_indices(num_frames: int, wanted: int) -> torch.Tensor:
    """``wanted`` frame indices spread evenly over ``num_frames`` (first and last included), without repeats."""
    return torch.linspace(0, num_frames - 1, min(wanted, num_frames)).round().long().unique()


class FrameAveraged:
    """An image reward applied to ``num_frames`` evenly spaced frames and averaged, sub-score by sub-score.

    ``reward`` is a reward name (built with ``settings``) or an image reward callable.
    """

    modality = "video"

    def __init__(
        self, reward: str | Callable[..., Any], num_frames: int = 4, settings: Mapping[str, Any] | None = None
    ) -> None:
        if num_frames < 1:
            raise ValueError(f"num_frames must be >= 1, got {num_frames}")
        self.name = reward if isinstance(reward, str) else getattr(reward, "__name__", type(reward).__name__)
        self.reward = build_reward(reward, **(settings or {})) if isinstance(reward, str) else reward
        self.num_frames = num_frames

    def __call__(
        self, videos: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        batch = videos.shape[0]
        frames = videos[:, frame_indices(videos.shape[1], self.num_frames)]
        count = frames.shape[1]
        scores = score(
            self.name,
            self.reward,
            frames.flatten(0, 1),
            [prompt for prompt in prompts for _ in range(count)],
            [meta for meta in metadata for _ in range(count)],
        )
        averaged = {key: value.view(batch, count).mean(dim=1) for key, value in scores.items()}
        # A single-score image reward gives a single-score video reward.
        return averaged[self.name] if list(averaged) == [self.name] else averaged


class TemporalConsistency:
    """Similarity of consecutive frames, averaged over the clip.

    ``encoder="pixels"``: ``1 - mean |f_{k+1} - f_k|`` (in [0, 1]).
    ``encoder="clip"``: mean cosine similarity of consecutive frames' open_clip
    image embeddings (weights as for ``clip_score``: ``checkpoint`` or the
    default ViT-H-14 from the Hugging Face cache).
    """

    modality = "video"

    def __init__(
        self,
        encoder: str = "pixels",
        model_name: str = "ViT-H-14",
        checkpoint: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if encoder not in ("pixels", "clip"):
            raise ValueError(f"unknown encoder {encoder!r}; allowed: 'pixels', 'clip'")
        self.encoder, self.device, self.dtype = encoder, device, dtype
        if encoder == "clip":
            from rewards.clip_score import DEFAULT_FILE, DEFAULT_REPO

            path = weights.weights_file(checkpoint, DEFAULT_REPO, DEFAULT_FILE, "temporal_consistency")
            self.model = load_open_clip(model_name, path, device, dtype)

    @torch.no_grad()
    def __call__(
        self, videos: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        if videos.shape[1] < 2:
            raise ValueError(f"temporal_consistency needs at least 2 frames, got {videos.shape[1]}")
        if self.encoder == "pixels":
            return 1.0 - (videos[:, 1:] - videos[:, :-1]).abs().float().mean(dim=(1, 2, 3, 4)).cpu()
        batch, frames = videos.shape[:2]
        pixels = clip_preprocess(videos.flatten(0, 1).to(self.device), image_size_of(self.model)).to(
            self.dtype
        )
        features = F.normalize(self.model.encode_image(pixels).float(), dim=-1).view(batch, frames, -1)
        return (features[:, 1:] * features[:, :-1]).sum(-1).mean(dim=1).cpu()
