"""CLIPScore (Hessel et al., 2021) with open_clip: ``2.5 * max(cos(image, prompt), 0)``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rewards import weights
from rewards.clip_models import clip_similarity, load_open_clip, open_clip_module

DEFAULT_MODEL = "ViT-H-14"
DEFAULT_REPO = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
DEFAULT_FILE = "open_clip_pytorch_model.bin"


class CLIPScore:
    """CLIPScore of each image against its prompt.

    Weights: ``checkpoint`` (an open_clip state dict) or, by default,
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K/open_clip_pytorch_model.bin`` from
    the Hugging Face cache; ``model_name`` must match it (any open_clip
    architecture name, e.g. ``ViT-B-32`` with ``laion/CLIP-ViT-B-32-laion2B-s34B-b79K``).
    """

    modality = "image"
    #: settings that make it read a file the caller chooses (see :func:`rewards.registry.outside_settings`)
    outside_settings = ("checkpoint",)

    def __init__(
        self,
        model_name: str = DEFAULT_MODEL,
        checkpoint: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        path = weights.weights_file(checkpoint, DEFAULT_REPO, DEFAULT_FILE, "clip_score")
        self.device, self.dtype = device, dtype
        self.model = load_open_clip(model_name, path, device, dtype)
        self.tokenizer = open_clip_module().get_tokenizer(model_name)

    @classmethod
    def weights_status(cls) -> str:
        return weights.status(None, DEFAULT_REPO, DEFAULT_FILE)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        cosine = clip_similarity(self.model, self.tokenizer, images, list(prompts), self.device, self.dtype)
        return 2.5 * cosine.clamp(min=0.0).cpu()
