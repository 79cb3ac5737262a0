"""HPSv2 / HPSv2.1 (Wu et al., 2023): human preference score from a fine-tuned ViT-H-14 CLIP.

The score is the cosine similarity of image and prompt features, as in the
``hpsv2`` package. The ``hpsv2`` package itself is not needed (it downloads
the LAION weights first, lacks its BPE vocabulary in the wheel and pins
pytest and protobuf): the HPS checkpoint holds the whole CLIP state dict, so
open_clip builds ViT-H-14 without weights and loads it directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rewards import weights
from rewards.clip_models import clip_similarity, load_open_clip, open_clip_module

REPO = "xswu/HPSv2"
FILES = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}


class HPSv2:
    """HPSv2 (``version="v2.0"``) or HPSv2.1 (``"v2.1"``, default) score of each image for its prompt.

    Weights: ``checkpoint`` or ``xswu/HPSv2/HPS_v2.1_compressed.pt`` (or
    ``HPS_v2_compressed.pt``) from the Hugging Face cache.
    """

    modality = "image"
    #: settings that make it read a file the caller chooses (see :func:`rewards.registry.outside_settings`)
    outside_settings = ("checkpoint",)

    def __init__(
        self,
        version: str = "v2.1",
        checkpoint: str | Path | None = None,
        model_name: str = "ViT-H-14",
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if version not in FILES:
            raise ValueError(f"unknown HPS version {version!r}; allowed: {sorted(FILES)}")
        path = weights.weights_file(checkpoint, REPO, FILES[version], "hpsv2")
        self.device, self.dtype = device, dtype
        self.model = load_open_clip(model_name, path, device, dtype)
        self.tokenizer = open_clip_module().get_tokenizer(model_name)

    @classmethod
    def weights_status(cls) -> str:
        return weights.status(None, REPO, FILES["v2.1"])

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        return clip_similarity(
            self.model, self.tokenizer, images, list(prompts), self.device, self.dtype
        ).cpu()
