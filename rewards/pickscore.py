"""PickScore (Kirstain et al., 2023): a CLIP-H model fine-tuned on Pick-a-Pic preferences, via transformers.

Score = ``logit_scale.exp() * cos(image, prompt)`` (about 18-23 for real images).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rewards import weights
from rewards.clip_models import clip_preprocess

MODEL_REPO = "yuvalkirstain/PickScore_v1"
PROCESSOR_REPO = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"


def _features(output: Any) -> torch.Tensor:
    """Projected features from ``get_*_features``, whether it returns a tensor or a model output."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


class PickScore:
    """PickScore of each image for its prompt.

    Weights: ``model_path`` or ``yuvalkirstain/PickScore_v1`` (a ``CLIPModel``
    directory), and ``tokenizer_path`` or the tokenizer of
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``, from the Hugging Face cache.
    """

    modality = "image"
    #: settings that make it read files the caller chooses (see :func:`rewards.registry.outside_settings`)
    outside_settings = ("model_path", "tokenizer_path")

    def __init__(
        self,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoTokenizer, CLIPModel  # imported here: it takes seconds

        model_dir = weights.weights_directory(model_path, MODEL_REPO, "pickscore")
        tokenizer_dir = weights.weights_directory(tokenizer_path, PROCESSOR_REPO, "pickscore")
        self.device, self.dtype = device, dtype
        self.model = (
            CLIPModel.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval().requires_grad_(False)
        )
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        vision = self.model.config.vision_config
        self.image_size = vision.image_size

    @classmethod
    def weights_status(cls) -> str:
        model, tokenizer = weights.status(None, MODEL_REPO), weights.status(None, PROCESSOR_REPO)
        return model if model.startswith("missing") else tokenizer

    @torch.no_grad()
    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        pixels = clip_preprocess(images.to(self.device), self.image_size).to(self.dtype)
        text = self.tokenizer(
            list(prompts), padding=True, truncation=True, max_length=77, return_tensors="pt"
        )
        image_features = F.normalize(
            _features(self.model.get_image_features(pixel_values=pixels)).float(), dim=-1
        )
        text_features = F.normalize(
            _features(self.model.get_text_features(**text.to(self.device))).float(), dim=-1
        )
        return (self.model.logit_scale.exp().float() * (image_features * text_features).sum(-1)).cpu()
