"""Model backends: one file each, one registry line each.

``model.backend`` in a config picks a class of :data:`BACKENDS`; the class
declares the keys of its ``model`` section (``config_class``), checks them
with the rest of the config (``check``), builds itself (``from_config``) and
chooses how its weight copies are kept (``weight_copies``). As a *flow
model* it then gives a policy (:mod:`flowrl.policy`) what sampling and
training need: ``encode``, ``velocity(network, x, t, cond[, r])``,
``decode``, ``initial_noise``, ``time_grid``, ``sample_shape``, ``time_shift``, ``device``,
``mean_flow``, ``to``, ``save_network`` (:class:`FlowModel`).

Adding a diffusers backend: ``my_model.py`` subclassing
:class:`~flowrl.models.diffusers_model.DiffusersFlowModel`, one line here (or
:func:`register_backend`), a tiny builder in :mod:`flowrl.testing`, a recipe
and a test. The diffusers backends import diffusers only when they load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from flowrl.config_schema import ConfigError
from flowrl.models.diffusers_model import DiffusersFlowModel, DiffusersModelConfig
from flowrl.models.flux import FluxModel, FluxModelConfig
from flowrl.models.sd3 import SD3Model
from flowrl.models.shapes import (
    SHIPPED_MODELS,
    ShapesFlowModel,
    ShapesModelConfig,
    load_shapes_model,
)
from flowrl.models.shapes_dit import ShapesDiT, ShapesDiTConfig
from flowrl.models.wan import WanModel, WanModelConfig
from flowrl.shipped_models import DEFAULT_BASE

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


class FlowModel(Protocol):
    """What a backend gives a policy (module docstring)."""

    #: the dataclass of the backend's ``model`` section
    config_class: type
    #: whether the held-out evaluation can render and verify its samples (the shapes worlds)
    renders_world: bool
    #: whether samples are clips ``[T, C, H, W]`` rather than images
    is_video: bool
    #: samples per generation batch (evaluation, the app)
    generate_batch_size: int
    #: the trained network (its copies live in the policy's weight copies)
    network: nn.Module

    @classmethod
    def check(cls, config: TrainConfig) -> None: ...

    @classmethod
    def from_config(cls, config: Any) -> FlowModel: ...

    def weight_copies(self, config: Any, roles: Sequence[str]) -> Any: ...

    @property
    def sample_shape(self) -> tuple[int, ...]: ...

    @property
    def time_shift(self) -> float: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def mean_flow(self) -> bool: ...

    def to(self, device: torch.device | str) -> FlowModel: ...

    def encode(self, prompts: list[str]) -> Any: ...

    def velocity(
        self, network: nn.Module, x: torch.Tensor, t: torch.Tensor, cond: Any, **r: Any
    ) -> torch.Tensor: ...

    def decode(self, x: torch.Tensor) -> torch.Tensor: ...

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor: ...

    def time_grid(self, num_steps: int) -> torch.Tensor: ...

    def save_network(self, network: nn.Module, directory: Path) -> None: ...

    # Optional: ``low_precision_modules(network) -> list[nn.Module]``, the layers whose weights a frozen copy
    # may hold in the autocast dtype under mixed precision (those autocast runs in it anyway); a backend
    # without it keeps float32 copies (flowrl.weight_copies).
    # Optional: ``encode_media(media) -> x``, media in [0, 1] to the sampler's space (the inverse of ``decode``):
    # off-policy samples to train on (SePPO's winners, flowrl.demonstrations); a backend without it cannot.
    # Optional: ``bf16_pays_on_cpu: bool`` (class attribute), whether ``training.mixed_precision: auto`` picks
    # bfloat16 on a CPU with bfloat16 matrix instructions (measured per backend; absent: float32 there).


BACKENDS: dict[str, type] = {
    "shapes": ShapesFlowModel,
    "sd3": SD3Model,
    "flux": FluxModel,
    "wan": WanModel,
}


def register_backend(name: str, backend: type) -> None:
    """Make ``model.backend: <name>`` select ``backend`` (a :class:`FlowModel` class)."""
    BACKENDS[name] = backend


def backend_class(name: str) -> type:
    """The registered backend called ``name``; an unknown name is an error naming the allowed ones."""
    if name not in BACKENDS:
        raise ConfigError(f"model.backend={name!r} is not allowed; allowed: {list(BACKENDS)}")
    return BACKENDS[name]


__all__ = [
    "BACKENDS",
    "DEFAULT_BASE",
    "SHIPPED_MODELS",
    "DiffusersFlowModel",
    "DiffusersModelConfig",
    "FlowModel",
    "FluxModel",
    "FluxModelConfig",
    "SD3Model",
    "ShapesDiT",
    "ShapesDiTConfig",
    "ShapesFlowModel",
    "ShapesModelConfig",
    "WanModel",
    "WanModelConfig",
    "backend_class",
    "load_shapes_model",
    "register_backend",
]
