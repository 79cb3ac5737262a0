"""The shapes backend: a ShapesDiT (image, clip or MeanFlow) as a policy's flow model, fully fine-tuned.

Pixels: the model works on ``x = 2 image - 1`` (``[3, H, W]`` images or
``[T, 3, H, W]`` clips); decoding maps back to [0, 1]. Conditioning is the
prompt's token ids and mask (the text encoder is part of the network and is
trained with it), and for an image-to-video model the clip's first frame in
model space as a third entry. The shapes world is trained and sampled on the unshifted
time grid. Copies are explicit modules (the model has 2.6M parameters).
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flowrl.config_schema import ConfigError, choice
from flowrl.models.dtypes import DTYPES
from flowrl.models.noise import seeded_noise
from flowrl.models.shapes_dit import ShapesDiT, TextContext, read_model_config
from flowrl.shipped_models import SHIPPED_MODELS
from flowrl.weight_copies import ModuleCopies
from samplers import timesteps

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


def load_shapes_model(name_or_path: str) -> ShapesDiT:
    """A shapes model by shipped name (``shapes-base``) or by the path of a saved model directory."""
    path = SHIPPED_MODELS.get(name_or_path, Path(name_or_path))
    if not path.is_dir():
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither a shipped model {sorted(SHIPPED_MODELS)} nor a directory"
        )
    return ShapesDiT.from_pretrained(path)


def model_makes_continuations(name_or_path: str) -> bool:
    """Whether the shapes model ``name_or_path`` is an image-to-video model (read from its config.json alone)."""
    path = SHIPPED_MODELS.get(name_or_path, Path(name_or_path))
    config = path / "config.json"
    return config.is_file() and read_model_config(config).image_condition


def images_to_model_space(images: torch.Tensor) -> torch.Tensor:
    """[0, 1] images to the model's [-1, 1] pixels."""
    return images * 2.0 - 1.0


def model_space_to_images(x: torch.Tensor) -> torch.Tensor:
    """The model's pixels to [0, 1] images (clamped)."""
    return ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0)


@dataclass
class ShapesModelConfig:
    """The ``model`` section of ``backend: shapes``: a shipped shapes model name (``shapes-base-v2``,
    ``shapes-base``, ``shapes-meanflow``, ``shapes-video``, ``shapes-video-v2``, ``shapes-video-i2v``) or a
    saved ShapesDiT directory."""

    #: a shipped shapes model (shapes-base-v2, shapes-base, shapes-meanflow, shapes-video, shapes-video-v2,
    #: shapes-video-i2v) or a ShapesDiT directory
    name: str = "shapes-base"
    #: the backend (a name registered in flowrl.models): shapes, sd3, flux, wan
    backend: str = "shapes"
    #: the shapes model trains in float32 only
    dtype: str = field(default="float32", metadata=choice(*DTYPES))


def _sharded(network: nn.Module) -> bool:
    """Whether ``network``'s weights are sharded (FSDP's DTensors): they are whole only inside its forward."""
    return any(type(parameter).__name__ == "DTensor" for parameter in network.parameters())


class TextContexts:
    """The text contexts (:class:`~flowrl.models.shapes_dit.TextContext`) of the last few (network, weights,
    prompt batch) triples, so that the text encoder runs once per rollout instead of once per step. A context is reused only for the same network object whose
    parameters have not changed since (their in-place version counters), and the same token ids and
    mask; it is used without gradients (and outside ``torch.func`` transforms) only."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._entries: collections.OrderedDict[tuple, tuple[weakref.ref, TextContext]] = (
            collections.OrderedDict()
        )

    def get(self, network: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> TextContext:
        module = getattr(network, "module", network)  # a DDP-wrapped network encodes with its module
        key = (
            id(module),
            sum(parameter._version for parameter in module.parameters()),
            tuple(ids.shape),
            ids.cpu().numpy().tobytes(),
            mask.cpu().numpy().tobytes(),
            ids.device,
        )
        entry = self._entries.get(key)
        if entry is not None and entry[0]() is module:
            self._entries.move_to_end(key)
            return entry[1]
        context = module.encode_text(ids, mask)
        self._entries[key] = (weakref.ref(module), context)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return context


class ShapesFlowModel:
    """A ShapesDiT as a flow model (module docstring)."""

    config_class = ShapesModelConfig
    #: evaluation renders this world (the shapes or moving-shapes world) to judge the model
    renders_world = True
    #: images per generation batch
    generate_batch_size = 128
    time_shift = 1.0
    #: ``training.mixed_precision: auto`` picks bf16 on a CPU with bfloat16 matrix instructions
    #: (:mod:`flowrl.precision`; the main job's step 1.44x, learning unchanged)
    bf16_pays_on_cpu = True

    def __init__(self, network: ShapesDiT) -> None:
        self.network = network
        self.text_contexts = TextContexts()

    @classmethod
    def check(cls, config: TrainConfig) -> None:
        if config.model.dtype != "float32":
            raise ConfigError(
                f"model.dtype={config.model.dtype!r} is not allowed for the shapes backend; it trains in float32 only"
            )
        continues = model_makes_continuations(config.model.name)
        if continues and config.evaluation_world not in (None, "video_shapes_i2v"):
            raise ConfigError(
                f"data.prompts={config.data.prompts!r} is not allowed for the image-to-video model "
                f"{config.model.name!r}; its prompts must carry first frames (allowed: video-shapes-i2v-train)"
            )
        if continues and (
            config.sampler.guidance_scale != 1.0
            or any(
                scale != 1.0
                for scale in (*config.evaluation.guidance_scales, *config.evaluation.base_guidance_scales)
            )
        ):
            raise ConfigError(
                f"sampler.guidance_scale={config.sampler.guidance_scale} (evaluation: "
                f"{config.evaluation.guidance_scales}, base {config.evaluation.base_guidance_scales}) is not "
                f"allowed for the image-to-video model {config.model.name!r}; it samples without CFG (allowed: 1.0)"
            )
        if config.sampler.negative_prompt:
            raise ConfigError(
                f"sampler.negative_prompt={config.sampler.negative_prompt!r} is not allowed for the shapes backend; "
                "its CFG guides against the empty prompt it was trained to drop to (allowed: '')"
            )

    @classmethod
    def from_config(cls, config: ShapesModelConfig) -> ShapesFlowModel:
        return cls(load_shapes_model(config.name))

    def weight_copies(self, config: ShapesModelConfig, roles: Sequence[str]) -> ModuleCopies:
        return ModuleCopies(self.network, roles)

    @staticmethod
    def low_precision_modules(network: nn.Module) -> list[nn.Module]:
        """The linear layers outside the text encoder (which runs in float32 under CPU autocast)."""
        text = set(network.text_encoder.modules())
        return [
            module for module in network.modules() if isinstance(module, nn.Linear) and module not in text
        ]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.network.sample_shape

    @property
    def is_video(self) -> bool:
        return self.network.is_video

    @property
    def mean_flow(self) -> bool:
        return self.network.config.mean_flow

    @property
    def image_conditioned(self) -> bool:
        """Whether the network continues a given first frame (image-to-video)."""
        return self.network.config.image_condition

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    def to(self, device: torch.device | str) -> ShapesFlowModel:
        self.network.to(device)
        return self

    def encode(self, prompts: list[str], images: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """``(ids, mask)``, and for an image-to-video model its first frames ``images`` ``[B, 3, H, W]`` in
        [0, 1], in model space."""
        ids, mask = self.network.encode_prompts(prompts)
        if images is None:
            return ids, mask
        return ids, mask, images_to_model_space(images.float()).to(ids.device)

    def velocity(
        self, network: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``network``'s velocity; without gradients the prompts' text context comes from
        :attr:`text_contexts` (encoded once per network, weights and prompt batch)."""
        ids, mask, *first_frame = cond
        image = first_frame[0] if first_frame else None
        if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active() or _sharded(network):
            return network(x, t, ids, mask, r=r, image=image)  # trained, MeanFlow's jvp, or FSDP-sharded
        return network(x, t, ids, mask, r=r, text=self.text_contexts.get(network, ids, mask), image=image)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return model_space_to_images(x)

    def encode_media(self, media: torch.Tensor) -> torch.Tensor:
        """Media in [0, 1] (images or clips) to model space, the inverse of :meth:`decode`."""
        return images_to_model_space(media.float()).to(self.device)

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Standard normal pixel-space noise, row ``i`` seeded by ``seeds[i]``."""
        return seeded_noise(seeds, self.sample_shape, device)

    def time_grid(self, num_steps: int) -> torch.Tensor:
        """The unshifted grid ``linspace(1, 0, S + 1)`` the shapes models were trained and sampled on."""
        return timesteps(num_steps, shift=self.time_shift)

    def save_network(self, network: nn.Module, directory: Path) -> None:
        network.save_pretrained(directory)
