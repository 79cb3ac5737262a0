"""The Stable Diffusion 3 / 3.5 backend (``StableDiffusion3Pipeline``).

Checkpoints: ``stabilityai/stable-diffusion-3-medium-diffusers``,
``stabilityai/stable-diffusion-3.5-medium``, ``stabilityai/stable-diffusion-3.5-large``
(or a local directory with the same layout).

Conditioning: ``(prompt_embeds [B, 77 + L, D], pooled [B, P])`` from the two
CLIP encoders and T5 (``L = max_sequence_length``), exactly as the pipeline's
``encode_prompt`` builds them; the empty prompt is the pipeline's negative
prompt for CFG. Latents ``[B, 16, H/8, W/8]`` are the sampler's layout. The
transformer's timestep is ``1000 t``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from flowrl.models.diffusers_model import DiffusersFlowModel


class SD3Model(DiffusersFlowModel):
    """An SD3/SD3.5 pipeline as a velocity model (see module docstring)."""

    pipeline_class_name = "StableDiffusion3Pipeline"
    default_max_sequence_length = 256
    default_lora_targets = (
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "attn.to_k",
        "attn.to_out.0",
        "attn.to_q",
        "attn.to_v",
    )

    def text_encoders(self) -> list[nn.Module]:
        pipe = self.pipeline
        return [m for m in (pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3) if m is not None]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        factor = self.vae_scale_factor
        return (self.transformer.config.in_channels, self.height // factor, self.width // factor)

    @property
    def time_shift(self) -> float:
        config = self.pipeline.scheduler.config
        if config.get("use_dynamic_shifting"):
            raise ValueError("this SD3 scheduler uses dynamic shifting; set sampler.time_shift explicitly")
        return float(config.get("shift", 1.0))

    def scheduler_arguments(self, num_steps: int) -> dict[str, Any]:
        """The SD3 pipeline's: ``num_inference_steps``, and ``mu`` from the token count with dynamic shifting."""
        arguments: dict[str, Any] = {"num_inference_steps": num_steps}
        config = self.pipeline.scheduler.config
        if config.get("use_dynamic_shifting"):
            patch = self.transformer.config.patch_size
            tokens = (self.height // self.vae_scale_factor // patch) * (
                self.width // self.vae_scale_factor // patch
            )
            base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
            base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.16)
            arguments["mu"] = base_shift + (max_shift - base_shift) * (tokens - base_len) / (
                max_len - base_len
            )
        return arguments

    def _encode_text(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        embeds, _, pooled, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=self.device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=False,
            max_sequence_length=self.max_sequence_length,
        )
        return embeds, pooled

    def velocity(self, transformer: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """``v(x, t)`` of the MM-DiT, timestep ``1000 t``, computed in the transformer's dtype."""
        embeds, pooled = cond
        out = transformer(
            hidden_states=x.to(self.dtype),
            timestep=(t.float() * 1000).expand(x.shape[0]),
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]
        return out.to(x.dtype)
