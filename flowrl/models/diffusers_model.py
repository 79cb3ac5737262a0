"""What the SD3, FLUX and Wan backends share: a loaded diffusers pipeline seen as a flow model.

A backend turns the pipeline into the pieces the trainer needs:

- ``encode(prompts)``: conditioning tuples, one row per prompt, cached per
  prompt on the CPU; the text encoders visit the accelerator only while they
  encode (``offload_text_encoders``) and are never trained;
- ``velocity(transformer, x, t, cond)``: the flow velocity ``v = eps - x0`` at
  time ``t`` in [0, 1] (diffusers' sigma) of latents ``x`` in the sampler's
  layout (``sample_shape``), returned in ``x``'s dtype;
- ``decode(x)``: images in [0, 1] through the VAE, kept in float32 and run in
  chunks: ``image = VAE(x / scaling_factor + shift_factor)``;
- ``time_grid(S)``: the default S-step grid, exactly the sigmas the
  pipeline's own scheduler takes when the stock pipeline runs S steps with
  default arguments (SD3: ``[1, .960, ..., .278, .0089, 0]`` at S = 10, not
  ``shift(linspace(1, 0, S + 1))``; FLUX: its resolution-dependent ``mu``), so
  that a rollout equals the stock ``pipe(prompt, num_inference_steps=S)`` image
  (Wan's stock scheduler is UniPC, a multistep solver: our samplers take its
  sigmas with their own steps);
- ``time_shift``: the model's own SD3 shift ``s`` of
  ``t' = s t / (1 + (s - 1) t)`` read from its scheduler config (the grid
  ``sampler.time_shift`` builds when it is set).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from flowrl.config_schema import ConfigError, at_least, choice
from flowrl.models.dtypes import DTYPES
from flowrl.models.noise import seeded_noise
from flowrl.shipped_models import SHIPPED_MODELS
from flowrl.weight_copies import AdapterCopies, ModuleCopies

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class DiffusersModelConfig:
    """The ``model`` section of a diffusers backend (``sd3``, ``flux``, ``wan``): a diffusers
    ``from_pretrained`` id (read from the local HF cache when offline) or pipeline directory, trained
    through peft LoRA adapters (``lora_rank: 0`` = full fine-tuning of the transformer)."""

    #: a diffusers from_pretrained id (read from the local Hugging Face cache when offline) or a pipeline
    #: directory
    name: str = ""
    #: the backend (a name registered in flowrl.models): sd3, flux, wan, shapes
    backend: str = "sd3"
    #: the frozen weights' dtype; trainable LoRA weights stay float32
    dtype: str = field(default="float32", metadata=choice(*DTYPES))
    #: image height in pixels (a multiple of the VAE's factor x the patch size)
    height: int = field(default=512, metadata=at_least(16))
    #: image width in pixels
    width: int = field(default=512, metadata=at_least(16))
    #: T5 text length in tokens (None = the model's default: 256 for SD3, 512 for FLUX and Wan)
    max_sequence_length: int | None = field(default=None, metadata=at_least(1))
    #: rank of the peft LoRA adapters on the transformer (0 = full fine-tuning)
    lora_rank: int = field(default=32, metadata=at_least(0))
    #: LoRA scaling alpha (the update is alpha / rank x B A)
    lora_alpha: float = field(default=64.0, metadata=at_least(0.0, strict=True))
    #: module name suffixes to adapt (empty = the attention projections of every block)
    lora_target_modules: list[str] = field(default_factory=list)
    #: recompute the transformer's activations in the backward pass (less memory, about a third more
    #: compute)
    gradient_checkpointing: bool = False
    #: a diffusers attention backend (``native`` = PyTorch SDPA, ``xformers``, ``flash``, ...); None = default
    attention_backend: str | None = None
    #: ``torch.compile`` the transformer
    compile: bool = False
    #: keep the text encoders on the CPU between prompt encodings
    offload_text_encoders: bool = True


class DiffusersFlowModel:
    """Base class of the diffusers backends (see module docstring); subclasses name their pipeline."""

    #: the diffusers pipeline class (imported lazily: diffusers is slow to import)
    pipeline_class_name: ClassVar[str]
    #: default text length of the T5 encoder (tokens) when the config leaves it unset
    default_max_sequence_length: ClassVar[int]
    #: LoRA targets when the config names none: the attention projections of the joint blocks
    default_lora_targets: ClassVar[tuple[str, ...]]
    #: the keys of the ``model`` section
    config_class: ClassVar[type] = DiffusersModelConfig
    #: the held-out evaluation renders a shapes world: not for these models
    renders_world: ClassVar[bool] = False
    #: images (SD3, FLUX); Wan's clips say True
    is_video: ClassVar[bool] = False
    mean_flow: ClassVar[bool] = False
    #: images per generation batch
    generate_batch_size: ClassVar[int] = 16
    #: where the pipeline's modules are (set by ``to``)
    device: torch.device

    def __init__(
        self,
        pipeline: Any,
        height: int,
        width: int,
        max_sequence_length: int | None = None,
        offload_text_encoders: bool = True,
        decode_batch_size: int = 8,
    ) -> None:
        self.pipeline = pipeline
        self.transformer: nn.Module = pipeline.transformer
        self.vae: nn.Module = pipeline.vae.eval().requires_grad_(False)
        if self.vae.dtype != torch.float32:
            self.vae.to(torch.float32)
        self.dtype = self.transformer.dtype
        self.height, self.width = height, width
        self.max_sequence_length = max_sequence_length or self.default_max_sequence_length
        self.offload_text_encoders = offload_text_encoders
        self.decode_batch_size = decode_batch_size
        self.device = torch.device("cpu")
        self._cache: dict[str, tuple[torch.Tensor, ...]] = {}
        for encoder in self.text_encoders():
            encoder.eval().requires_grad_(False)
        factor = self.vae_scale_factor
        if height % (2 * factor) or width % (2 * factor):
            raise ValueError(
                f"model.height={height} and model.width={width} must be multiples of {2 * factor} "
                f"(twice the VAE's downsampling factor {factor})"
            )

    @classmethod
    def pipeline_class(cls) -> Any:
        import diffusers

        return getattr(diffusers, cls.pipeline_class_name)

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str = "float32", **kwargs: Any) -> DiffusersFlowModel:
        """Load a pipeline by hub id (from the local HF cache when offline) or directory; the VAE is read in
        float32 whatever ``dtype`` (upcasting bf16-rounded VAE weights would not restore them)."""
        try:
            pipeline = cls.pipeline_class().from_pretrained(
                name_or_path, dtype={"default": DTYPES[dtype], "vae": torch.float32}
            )
        except (OSError, ValueError) as error:
            where = "directory" if Path(name_or_path).is_dir() else "hub id (looked up in the local HF cache)"
            raise OSError(
                f"model.name={name_or_path!r} could not be loaded as a {cls.pipeline_class_name} {where}: {error}"
            ) from error
        return cls(pipeline, **kwargs)

    @classmethod
    def check(cls, config: TrainConfig) -> None:
        """Model settings that need more than one key (or another section), before anything loads."""
        model = config.model
        if not model.name or model.name in SHIPPED_MODELS:
            raise ConfigError(
                f"model.name={model.name!r} is not allowed for model.backend={model.backend!r}; give a diffusers "
                "pipeline id (e.g. stabilityai/stable-diffusion-3.5-medium) or directory"
            )
        for key in ("height", "width"):
            if getattr(model, key) % 16:
                raise ConfigError(
                    f"model.{key}={getattr(model, key)} is not allowed; it must be a multiple of 16 "
                    "(VAE downsampling x latent packing)"
                )
        if model.attention_backend is not None:
            from diffusers.models.attention_dispatch import AttentionBackendName

            allowed = [backend.value for backend in AttentionBackendName]
            if model.attention_backend not in allowed:
                raise ConfigError(
                    f"model.attention_backend={model.attention_backend!r} is not allowed; allowed: {allowed}"
                )
        if config.evaluation.guidance_scales or config.evaluation.base_guidance_scales:
            raise ConfigError(
                f"evaluation.guidance_scales={config.evaluation.guidance_scales} and evaluation.base_guidance_scales="
                f"{config.evaluation.base_guidance_scales}: the held-out evaluation renders a shapes world and runs "
                f"on shapes models only; set both to [] for model.backend={model.backend!r}"
            )

    @classmethod
    def model_kwargs(cls, config: Any) -> dict[str, Any]:
        """Constructor arguments of this backend read from its config (beyond the shared ones)."""
        return {}

    @classmethod
    def from_config(cls, config: Any) -> DiffusersFlowModel:
        """The pipeline of ``config.name`` with the config's size, text length and attention."""
        model = cls.from_pretrained(
            config.name,
            config.dtype,
            height=config.height,
            width=config.width,
            max_sequence_length=config.max_sequence_length,
            offload_text_encoders=config.offload_text_encoders,
            **cls.model_kwargs(config),
        )
        if config.attention_backend:
            model.transformer.set_attention_backend(config.attention_backend)
        return model

    def weight_copies(self, config: Any, roles: Sequence[str]) -> AdapterCopies | ModuleCopies:
        """LoRA adapters per role (``lora_rank > 0``), else module copies of the transformer."""
        transformer = self.transformer
        transformer.requires_grad_(False)
        if config.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        if config.lora_rank:
            from peft import LoraConfig

            lora = LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                init_lora_weights="gaussian",
                target_modules=list(config.lora_target_modules or self.default_lora_targets),
            )
            copies: AdapterCopies | ModuleCopies = AdapterCopies(transformer, lora, roles)
        else:
            copies = ModuleCopies(transformer.requires_grad_(True), roles)
        transformer.train()
        if config.compile:
            transformer.compile()
        return copies

    @property
    def network(self) -> nn.Module:
        return self.transformer

    def scheduler_arguments(self, num_steps: int) -> dict[str, Any]:
        """What the stock pipeline passes its scheduler's ``set_timesteps`` for ``num_steps`` steps."""
        return {"num_inference_steps": num_steps}

    def time_grid(self, num_steps: int) -> torch.Tensor:
        """``[num_steps + 1]`` times from 1 to 0: the sigmas of the pipeline's scheduler (module docstring)."""
        scheduler = copy.deepcopy(self.pipeline.scheduler)
        scheduler.set_timesteps(**self.scheduler_arguments(num_steps))
        sigmas = torch.as_tensor(scheduler.sigmas, dtype=torch.float32).cpu()
        if sigmas.shape != (num_steps + 1,):
            raise ValueError(
                f"the {type(scheduler).__name__} scheduler gave {sigmas.shape[0]} sigmas for {num_steps} steps; "
                "set sampler.time_shift to use a shifted uniform grid instead"
            )
        return sigmas

    def save_network(self, network: nn.Module, directory: Path) -> None:
        """A fully fine-tuned transformer, as ``transformer/`` of a pipeline directory."""
        directory.mkdir(parents=True, exist_ok=True)
        network.save_pretrained(directory / "transformer")

    # --- what subclasses define ----------------------------------------------------------------------

    def text_encoders(self) -> list[nn.Module]:
        raise NotImplementedError

    @property
    def sample_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    @property
    def time_shift(self) -> float:
        raise NotImplementedError

    def _encode_text(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def velocity(self, transformer: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any) -> torch.Tensor:
        raise NotImplementedError

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Starting noise in the sampler's layout, row ``i`` seeded by ``seeds[i]`` exactly as the pipeline
        draws it for ``generator=torch.Generator().manual_seed(seeds[i])`` (one image per call)."""
        return seeded_noise(seeds, self.sample_shape, device)

    def vae_latents(self, x: torch.Tensor) -> torch.Tensor:
        """Sampler-layout latents to the VAE's ``[B, C, h, w]`` (identity unless the model packs them)."""
        return x

    def sampler_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """The VAE's ``[B, C, h, w]`` latents in the sampler's layout (the inverse of :meth:`vae_latents`)."""
        return latents

    # --- shared --------------------------------------------------------------------------------------

    @property
    def vae_scale_factor(self) -> int:
        return 2 ** (len(self.vae.config.block_out_channels) - 1)

    def to(self, device: torch.device | str) -> DiffusersFlowModel:
        """Move the transformer and VAE (and the text encoders unless offloaded) to ``device``."""
        self.device = torch.device(device)
        self.transformer.to(self.device)
        self.vae.to(self.device)
        if not self.offload_text_encoders:
            for encoder in self.text_encoders():
                encoder.to(self.device)
        return self

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        """Conditioning rows for ``prompts`` on the model's device; each new prompt is encoded once, alone,
        and cached."""
        missing = list(dict.fromkeys(prompt for prompt in prompts if prompt not in self._cache))
        if missing:
            encoders = self.text_encoders()
            for encoder in encoders:
                encoder.to(self.device)
            try:
                # One prompt at a time: an encoding must not depend on which prompts shared its batch
                # (kernels differ in the last bit with the batch size), or a resumed run would drift.
                for prompt in missing:
                    parts = self._encode_text([prompt])
                    self._cache[prompt] = tuple(part[0].to("cpu", self.dtype) for part in parts)
            finally:
                if self.offload_text_encoders:
                    for encoder in encoders:
                        encoder.to("cpu")
        rows = [self._cache[prompt] for prompt in prompts]
        return tuple(torch.stack(column).to(self.device) for column in zip(*rows))

    @torch.no_grad()
    def encode_media(self, media: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [0, 1] to sampler-layout latents, the inverse of :meth:`decode`: the VAE
        posterior's mode, ``(z - shift) * scale``."""
        config = self.vae.config
        latents = []
        for chunk in media.split(self.decode_batch_size):
            pixels = chunk.to(self.device, self.vae.dtype) * 2.0 - 1.0
            mode = self.vae.encode(pixels).latent_dist.mode()
            latents.append((mode.float() - (config.shift_factor or 0.0)) * config.scaling_factor)
        return self.sampler_latents(torch.cat(latents))

    @torch.no_grad()
    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [0, 1], float32, decoded ``decode_batch_size`` at a time."""
        config = self.vae.config
        latents = self.vae_latents(x.float())
        images = []
        for chunk in latents.split(self.decode_batch_size):
            chunk = chunk.to(self.device) / config.scaling_factor + (config.shift_factor or 0.0)
            images.append(self.vae.decode(chunk, return_dict=False)[0])
        return ((torch.cat(images) + 1.0) / 2.0).clamp(0.0, 1.0)
