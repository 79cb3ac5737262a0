"""Shared pieces of the CLIP-based rewards: open_clip models from local weights, and preprocessing.

open_clip builds the architecture by name and loads a local checkpoint, so
the same code path serves the real ViT-H-14 / ViT-L-14 weights and the tiny
random-weight ``flowrl-tiny-clip`` architecture the tests use (its config is
shipped in ``rewards/model_configs``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def open_clip_module():  # noqa: ANN201 (the open_clip module)
    """``open_clip``, imported on first use (it takes seconds) with flowrl's model configs added."""
    import open_clip

    open_clip.add_model_config(Path(__file__).parent / "model_configs")
    return open_clip


def load_open_clip(
    model_name: str, checkpoint: Path, device: str | torch.device, dtype: torch.dtype
) -> torch.nn.Module:
    """An open_clip model ``model_name`` with the weights of ``checkpoint``, frozen, in eval mode.

    The checkpoint is an open_clip state dict, optionally under ``"state_dict"``
    (HPS checkpoints), with or without a ``module.`` prefix.
    """
    model = open_clip_module().create_model(model_name, pretrained=None, device="cpu")
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)
    state = {key.removeprefix("module."): value for key, value in state.items()}
    model.load_state_dict(state)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def image_size_of(model: torch.nn.Module) -> int:
    """Input resolution of an open_clip model's visual tower."""
    size = model.visual.image_size
    return size[0] if isinstance(size, (tuple, list)) else int(size)


def clip_preprocess(images: torch.Tensor, size: int, mean=CLIP_MEAN, std=CLIP_STD) -> torch.Tensor:
    """CLIP input from ``[B, 3, H, W]`` images in [0, 1]: resize the short side (bicubic), centre crop, normalise."""
    height, width = images.shape[-2:]
    scale = size / min(height, width)
    resized = F.interpolate(
        images.float(),
        size=(max(size, round(height * scale)), max(size, round(width * scale))),
        mode="bicubic",
        align_corners=False,
        antialias=True,
    )
    top = (resized.shape[-2] - size) // 2
    left = (resized.shape[-1] - size) // 2
    cropped = resized[..., top : top + size, left : left + size].clamp(0, 1)
    mean_tensor = torch.tensor(mean, device=images.device).view(1, 3, 1, 1)
    std_tensor = torch.tensor(std, device=images.device).view(1, 3, 1, 1)
    return (cropped - mean_tensor) / std_tensor


@torch.no_grad()
def clip_similarity(
    model: torch.nn.Module, tokenizer, images: torch.Tensor, prompts: list[str], device, dtype
) -> torch.Tensor:
    """Cosine similarity ``[B]`` of each image with its own prompt under an open_clip model."""
    pixels = clip_preprocess(images.to(device), image_size_of(model)).to(dtype)
    image_features = F.normalize(model.encode_image(pixels).float(), dim=-1)
    text_features = F.normalize(model.encode_text(tokenizer(prompts).to(device)).float(), dim=-1)
    return (image_features * text_features).sum(-1)
