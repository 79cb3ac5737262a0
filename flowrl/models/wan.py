"""The Wan 2.1 text-to-video backend (``WanPipeline``).

Checkpoints: ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``, ``Wan-AI/Wan2.1-T2V-14B-Diffusers``
(or a local directory with the same layout).

Conditioning: ``(prompt_embeds [B, L, D],)`` from the UMT5 encoder, exactly as
the pipeline's ``encode_prompt`` builds them (zeroed past each prompt's own
tokens, ``L = max_sequence_length``, default 512); the empty prompt is the
pipeline's negative prompt for CFG. The sampler's layout is the VAE latent
``[B, 16, F', H/8, W/8]`` with ``F' = (num_frames - 1) / 4 + 1``, normalised
per channel as the transformer sees it, ``z = (latent - latents_mean) / latents_std``;
decoding undoes that and returns videos ``[B, T, 3, H, W]`` in [0, 1]
(``T = num_frames``; ``num_frames: 1`` trains on single frames, one latent
frame each). The transformer's timestep is ``1000 t``; the time shift is the
scheduler's ``flow_shift`` (Wan 2.1 ships 3.0 for 480p; 5.0 is meant for 720p).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flowrl.config_schema import ConfigError, at_least
from flowrl.models.diffusers_model import DiffusersFlowModel, DiffusersModelConfig

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class WanModelConfig(DiffusersModelConfig):
    """The ``model`` section of ``backend: wan``: the diffusers keys plus the clip length."""

    #: the backend: wan
    backend: str = "wan"
    #: frames per clip, 4k+1 (the VAE folds 4 frames into a latent after the first; 1 = single frames)
    num_frames: int = field(default=81, metadata=at_least(1))


def check_num_frames(num_frames: int, temporal_factor: int = 4) -> None:
    """Raise ``ValueError`` unless ``num_frames = temporal_factor * k + 1`` (the VAE's causal frame grouping)."""
    if num_frames < 1 or (num_frames - 1) % temporal_factor:
        raise ValueError(
            f"num_frames={num_frames} is not allowed; Wan needs {temporal_factor}k+1 frames "
            f"(1, {temporal_factor + 1}, {2 * temporal_factor + 1}, ..., 33, 81; 1 = single-frame mode)"
        )


class WanModel(DiffusersFlowModel):
    """A Wan 2.1 text-to-video pipeline as a velocity model (see module docstring)."""

    pipeline_class_name = "WanPipeline"
    config_class = WanModelConfig
    is_video = True
    default_max_sequence_length = 512
    default_lora_targets = (
        "attn1.to_q",
        "attn1.to_k",
        "attn1.to_v",
        "attn1.to_out.0",
        "attn2.to_q",
        "attn2.to_k",
        "attn2.to_v",
        "attn2.to_out.0",
    )

    @classmethod
    def check(cls, config: TrainConfig) -> None:
        try:
            check_num_frames(config.model.num_frames)
        except ValueError as error:
            raise ConfigError(f"model.{error}") from error
        super().check(config)

    @classmethod
    def model_kwargs(cls, config: WanModelConfig) -> dict[str, Any]:
        return {"num_frames": config.num_frames}

    def __init__(
        self,
        pipeline: Any,
        height: int,
        width: int,
        num_frames: int = 81,
        decode_batch_size: int = 1,
        **kwargs: Any,
    ) -> None:
        # One video per VAE call by default: the Wan VAE's activations grow with frames x pixels.
        super().__init__(pipeline, height, width, decode_batch_size=decode_batch_size, **kwargs)
        check_num_frames(num_frames, self.vae.config.scale_factor_temporal)
        self.num_frames = num_frames

    @property
    def vae_scale_factor(self) -> int:
        return self.vae.config.scale_factor_spatial

    def text_encoders(self) -> list[nn.Module]:
        return [self.pipeline.text_encoder]

    @property
    def latent_frames(self) -> int:
        """``F' = (T - 1) / 4 + 1``: the VAE keeps the first frame and folds every next 4 into one latent."""
        return (self.num_frames - 1) // self.vae.config.scale_factor_temporal + 1

    @property
    def sample_shape(self) -> tuple[int, ...]:
        factor = self.vae_scale_factor
        channels = self.transformer.config.in_channels
        return (channels, self.latent_frames, self.height // factor, self.width // factor)

    @property
    def time_shift(self) -> float:
        """The scheduler's shift: ``flow_shift`` of Wan's UniPC scheduler, or ``shift`` of a flow-matching Euler."""
        config = self.pipeline.scheduler.config
        if "flow_shift" in config:
            if not config.get("use_flow_sigmas"):
                raise ValueError(
                    "this Wan scheduler does not use flow sigmas (use_flow_sigmas=false); "
                    "set sampler.time_shift explicitly"
                )
            return float(config["flow_shift"])
        if config.get("use_dynamic_shifting"):
            raise ValueError("this Wan scheduler uses dynamic shifting; set sampler.time_shift explicitly")
        return float(config.get("shift", 1.0))

    def _encode_text(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        embeds, _ = self.pipeline.encode_prompt(
            prompt=prompts,
            do_classifier_free_guidance=False,
            num_videos_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return (embeds,)

    def velocity(self, transformer: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        """``v(x, t)`` of the Wan DiT on normalised latents, timestep ``1000 t``, in the transformer's dtype."""
        (embeds,) = cond
        out = transformer(
            hidden_states=x.to(self.dtype),
            timestep=(t.float() * 1000).expand(x.shape[0]),
            encoder_hidden_states=embeds,
            return_dict=False,
        )[0]
        return out.to(x.dtype)

    def _latent_statistics(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's per-channel ``(latents_mean, latents_std)``, shaped ``[1, C, 1, 1, 1]``."""
        config = self.vae.config
        mean = torch.tensor(config.latents_mean, device=device).view(1, config.z_dim, 1, 1, 1)
        std = torch.tensor(config.latents_std, device=device).view(1, config.z_dim, 1, 1, 1)
        return mean, std

    @torch.no_grad()
    def encode_media(self, media: torch.Tensor) -> torch.Tensor:
        """Videos ``[B, T, 3, H, W]`` in [0, 1] to normalised latents, the inverse of :meth:`decode`:
        ``(mode(VAE(v)) - latents_mean) / latents_std``."""
        mean, std = self._latent_statistics(self.device)
        latents = []
        for chunk in media.split(self.decode_batch_size):
            pixels = chunk.to(self.device, self.vae.dtype).transpose(1, 2) * 2.0 - 1.0  # [b, 3, T, H, W]
            latents.append((self.vae.encode(pixels).latent_dist.mode().float() - mean) / std)
        return torch.cat(latents)

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Videos ``[B, T, 3, H, W]`` in [0, 1], float32: ``VAE(z * latents_std + latents_mean)``,
        ``decode_batch_size`` videos at a time."""
        mean, std = self._latent_statistics(self.device)
        videos = []
        for chunk in x.float().split(self.decode_batch_size):
            latents = chunk.to(self.device) * std + mean
            videos.append(self.vae.decode(latents, return_dict=False)[0])  # [b, 3, T, H, W] in [-1, 1]
        return ((torch.cat(videos).transpose(1, 2) + 1.0) / 2.0).clamp(0.0, 1.0)
