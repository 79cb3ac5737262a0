"""The FLUX.1 backend (``FluxPipeline``).

Checkpoints: ``black-forest-labs/FLUX.1-dev`` (guidance-distilled: the
guidance value is an input, ``model.guidance``, default 3.5) and
``black-forest-labs/FLUX.1-schnell`` (no guidance input), or a local directory.

Conditioning: ``(prompt_embeds [B, L, D], pooled [B, P])`` from T5 and CLIP
as the pipeline's ``encode_prompt`` builds them. Latents are **packed** as
the transformer sees them: 2x2 patches of the ``[C, h, w]`` VAE latent become
tokens, ``[B, (h/2)(w/2), 4C]``; that is the sampler's layout, unpacked only
to decode. The transformer's timestep is ``t`` itself (it scales by 1000
inside). Time shift: the scheduler's dynamic shift for this image size,
``s = exp(mu)`` with ``mu`` linear in the number of image tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from flowrl.config_schema import at_least
from flowrl.models.diffusers_model import DiffusersFlowModel, DiffusersModelConfig
from flowrl.models.noise import seeded_noise


@dataclass
class FluxModelConfig(DiffusersModelConfig):
    """The ``model`` section of ``backend: flux``: the diffusers keys plus FLUX.1-dev's guidance input."""

    #: the backend: flux
    backend: str = "flux"
    #: FLUX.1-dev's embedded guidance value (models without a guidance input ignore it)
    guidance: float = field(default=3.5, metadata=at_least(0.0))


class FluxModel(DiffusersFlowModel):
    """A FLUX.1 pipeline as a velocity model (see module docstring)."""

    pipeline_class_name = "FluxPipeline"
    config_class = FluxModelConfig
    default_max_sequence_length = 512
    default_lora_targets = (
        "attn.to_k",
        "attn.to_q",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
    )

    @classmethod
    def model_kwargs(cls, config: FluxModelConfig) -> dict[str, Any]:
        return {"guidance": config.guidance}

    def __init__(self, pipeline: Any, height: int, width: int, guidance: float = 3.5, **kwargs: Any) -> None:
        super().__init__(pipeline, height, width, **kwargs)
        self.guidance = guidance if self.transformer.config.guidance_embeds else None
        rows, columns = self._latent_size()
        self._image_ids = pipeline._prepare_latent_image_ids(1, rows // 2, columns // 2, "cpu", self.dtype)

    def _latent_size(self) -> tuple[int, int]:
        """The VAE latent's ``(h, w)``, rounded down to even sizes as the pipeline does."""
        factor = self.vae_scale_factor
        return 2 * (self.height // (factor * 2)), 2 * (self.width // (factor * 2))

    def text_encoders(self) -> list[nn.Module]:
        pipe = self.pipeline
        return [m for m in (pipe.text_encoder, pipe.text_encoder_2) if m is not None]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        rows, columns = self._latent_size()
        return ((rows // 2) * (columns // 2), self.transformer.config.in_channels)

    @property
    def time_shift(self) -> float:
        """``exp(mu)`` (or ``mu`` for a linear shift) for this image's token count, as the pipeline computes it."""
        config = self.pipeline.scheduler.config
        if not config.get("use_dynamic_shifting"):
            return float(config.get("shift", 1.0))
        tokens = self.sample_shape[0]
        base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
        base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
        mu = base_shift + (max_shift - base_shift) * (tokens - base_len) / (max_len - base_len)
        return math.exp(mu) if config.get("time_shift_type", "exponential") == "exponential" else mu

    def scheduler_arguments(self, num_steps: int) -> dict[str, Any]:
        """The FLUX pipeline's: ``sigmas = linspace(1, 1/S, S)`` and, with dynamic shifting, ``mu``."""
        arguments: dict[str, Any] = {"sigmas": list(np.linspace(1.0, 1 / num_steps, num_steps))}
        config = self.pipeline.scheduler.config
        if config.get("use_dynamic_shifting"):
            base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
            base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
            tokens = self.sample_shape[0]
            arguments["mu"] = base_shift + (max_shift - base_shift) * (tokens - base_len) / (
                max_len - base_len
            )
        return arguments

    def _encode_text(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        embeds, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            device=self.device,
            num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
        )
        return embeds, pooled

    def velocity(self, transformer: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """``v(x, t)`` of the FLUX transformer on packed latents, with the embedded guidance value."""
        embeds, pooled = cond
        batch = x.shape[0]
        guidance = None
        if self.guidance is not None:
            guidance = torch.full((batch,), self.guidance, device=x.device, dtype=torch.float32)
        out = transformer(
            hidden_states=x.to(self.dtype),
            timestep=t.to(self.dtype).expand(batch),
            guidance=guidance,
            pooled_projections=pooled,
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=x.device, dtype=self.dtype),
            img_ids=self._image_ids.to(x.device),
            return_dict=False,
        )[0]
        return out.to(x.dtype)

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Noise drawn in the VAE latent's ``[C, h, w]`` layout, as the pipeline draws it, then packed."""
        rows, columns = self._latent_size()
        channels = self.transformer.config.in_channels // 4
        noise = seeded_noise(seeds, (channels, rows, columns), device)
        return self.pipeline._pack_latents(noise, len(seeds), channels, rows, columns)

    def vae_latents(self, x: torch.Tensor) -> torch.Tensor:
        return self.pipeline._unpack_latents(x, self.height, self.width, self.vae_scale_factor)

    def sampler_latents(self, latents: torch.Tensor) -> torch.Tensor:
        batch, channels, rows, columns = latents.shape
        return self.pipeline._pack_latents(latents, batch, channels, rows, columns)
