"""The policy backend a config names: the shapes model or a diffusers pipeline (SD3/SD3.5, FLUX, Wan 2.1)."""

from __future__ import annotations

from flowrl.config import ModelConfig
from flowrl.diffusers_policy import DiffusersPolicy
from flowrl.models import load_shapes_model
from flowrl.models.diffusers_model import DiffusersFlowModel
from flowrl.policy import ShapesPolicy


def diffusers_backend_class(backend: str) -> type[DiffusersFlowModel]:
    from flowrl.models.flux import FluxModel
    from flowrl.models.sd3 import SD3Model
    from flowrl.models.wan import WanModel

    return {"sd3": SD3Model, "flux": FluxModel, "wan": WanModel}[backend]


def load_diffusers_model(config: ModelConfig) -> DiffusersFlowModel:
    """The SD3, FLUX or Wan pipeline of ``config.name`` with the config's size (and Wan's frame count),
    text length and attention."""
    extra = {
        "flux": {"guidance": config.guidance},
        "wan": {"num_frames": config.num_frames},
    }.get(config.backend, {})
    backend = diffusers_backend_class(config.backend).from_pretrained(
        config.name,
        config.dtype,
        height=config.height,
        width=config.width,
        max_sequence_length=config.max_sequence_length,
        offload_text_encoders=config.offload_text_encoders,
        **extra,
    )
    if config.attention_backend:
        backend.transformer.set_attention_backend(config.attention_backend)
    return backend


def build_policy(
    config: ModelConfig, ema_decay: float = 0.0, separate_sampler: bool = False
) -> ShapesPolicy | DiffusersPolicy:
    """The trainable policy with its old, reference (and EMA, and a separate sampler) models, on the CPU."""
    if config.backend == "shapes":
        return ShapesPolicy(load_shapes_model(config.name), ema_decay, separate_sampler)
    policy = DiffusersPolicy(
        load_diffusers_model(config),
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_target_modules=config.lora_target_modules,
        ema_decay=ema_decay,
        gradient_checkpointing=config.gradient_checkpointing,
        separate_sampler=separate_sampler,
    )
    if config.compile:
        policy.backend.transformer.compile()
    return policy
