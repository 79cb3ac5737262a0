"""LAION aesthetic predictor: an MLP on L2-normalised CLIP ViT-L/14 image embeddings (scores ~1-10)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rewards import weights
from rewards.clip_models import clip_preprocess, image_size_of, load_open_clip

CLIP_REPO = "timm/vit_large_patch14_clip_224.openai"
CLIP_FILE = "open_clip_pytorch_model.bin"
MLP_REPO = "trl-lib/ddpo-aesthetic-predictor"
MLP_FILE = "aesthetic-model.pth"


class AestheticHead(nn.Module):
    """The improved-aesthetic-predictor MLP (``sac+logos+ava1-l14-linearMSE.pth``): dim -> 1024 -> 128 -> 64 -> 16 -> 1."""

    def __init__(self, dim: int = 768) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(dim, 1024),
            nn.Dropout(0.2),
            nn.Linear(1024, 128),
            nn.Dropout(0.2),
            nn.Linear(128, 64),
            nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, embedding: torch.Tensor) -> torch.Tensor:
        return self.layers(embedding)


class LaionAesthetic:
    """LAION aesthetic score of each image (the prompt is not used).

    Weights: ``clip_checkpoint`` or OpenAI's ViT-L/14 in open_clip format
    (``timm/vit_large_patch14_clip_224.openai/open_clip_pytorch_model.bin``), and
    ``head_checkpoint`` or ``trl-lib/ddpo-aesthetic-predictor/aesthetic-model.pth``
    (the same MLP as ``sac+logos+ava1-l14-linearMSE.pth``), from the Hugging Face cache.
    OpenAI's CLIP uses QuickGELU, hence the ``-quickgelu`` open_clip architecture:
    plain ``ViT-L-14`` would load the same weights without error and embed wrongly.
    """

    modality = "image"
    #: settings that make it read files the caller chooses (see :func:`rewards.registry.outside_settings`)
    outside_settings = ("clip_checkpoint", "head_checkpoint")

    def __init__(
        self,
        clip_checkpoint: str | Path | None = None,
        head_checkpoint: str | Path | None = None,
        model_name: str = "ViT-L-14-quickgelu",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        clip_path = weights.weights_file(clip_checkpoint, CLIP_REPO, CLIP_FILE, "aesthetic")
        head_path = weights.weights_file(head_checkpoint, MLP_REPO, MLP_FILE, "aesthetic")
        self.device, self.dtype = device, dtype
        self.clip = load_open_clip(model_name, clip_path, device, dtype)
        self.head = AestheticHead(self.clip.visual.output_dim)
        self.head.load_state_dict(torch.load(head_path, map_location="cpu", weights_only=True))
        self.head = self.head.to(device).eval().requires_grad_(False)

    @classmethod
    def weights_status(cls) -> str:
        clip, head = weights.status(None, CLIP_REPO, CLIP_FILE), weights.status(None, MLP_REPO, MLP_FILE)
        return clip if clip.startswith("missing") else head

    @torch.no_grad()
    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        pixels = clip_preprocess(images.to(self.device), image_size_of(self.clip)).to(self.dtype)
        embedding = F.normalize(self.clip.encode_image(pixels).float(), dim=-1)
        return self.head(embedding).squeeze(-1).cpu()
