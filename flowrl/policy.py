"""The policy: a flow model (the velocity network of a backend) plus its weight copies, one contract.

A policy answers, for each *role*, the velocity ``v(x, t, cond)`` (a MeanFlow
model's average velocity over ``[r, t]`` when given ``r``):

- ``trained`` — the weights the optimizer updates (:meth:`Policy.velocity`);
- ``old`` — the policy the loss compares against: DiffusionNFT's anchor of the
  implicit positive/negative policies, GRPO's behaviour policy (copied from
  the trained weights after every step);
- ``rollout`` — the copy that samples the rollouts: ``old`` itself unless the
  algorithm decouples them (CRD keeps a slower rollout copy);
- ``reference`` — the frozen base model;
- ``ema`` — an average of the trained weights (with ``training.ema_decay > 0``);
- ``tuned`` — what is evaluated and saved: the EMA when kept, else the trained.

With ``autocast_dtype`` (``training.mixed_precision: bf16``) every role's velocity is computed under
``torch.autocast`` and returned in float32 (:mod:`flowrl.precision`).

The flow model (:mod:`flowrl.models`: the shapes DiT or a diffusers
pipeline) knows prompts, noise, latents and decoding; the weight copies
(:mod:`flowrl.weight_copies`: module copies or LoRA adapters) know where each
role's weights live. Nothing else in the trainer or the algorithms depends
on which backend or which copy strategy is in use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from flowrl.precision import autocast, autocast_dtype
from flowrl.weight_copies import EMA, OLD, REFERENCE, ROLLOUT, TRAINED, TUNED, ModuleCopies
from samplers import VelocityFn, guided_velocity, timesteps

if TYPE_CHECKING:
    from flowrl.models import FlowModel

__all__ = ["EMA", "OLD", "REFERENCE", "ROLLOUT", "TRAINED", "TUNED", "Policy", "build_policy", "make_policy"]


class Policy:
    """A flow model with its trained weights and weight copies (module docstring)."""

    def __init__(
        self,
        flow_model: FlowModel,
        copies: Any,
        ema_decay: float = 0.0,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        self.flow_model = flow_model
        self.copies = copies
        self.ema_decay = ema_decay
        #: the dtype velocities are computed in under autocast (None: the weights' own)
        self.autocast_dtype = autocast_dtype
        self._unconditional: dict[str, Any] = {}

    @classmethod
    def for_inference(cls, flow_model: FlowModel) -> Policy:
        """A policy that only samples: every role is the flow model's network itself, nothing is copied."""
        return cls(flow_model, ModuleCopies(flow_model.network, (), trainable=False))

    # --- what the flow model knows -------------------------------------------------------------------

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.flow_model.sample_shape

    @property
    def time_shift(self) -> float:
        """The model's own SD3 time shift ``s`` of ``t' = s t / (1 + (s - 1) t)`` (1 for the shapes world)."""
        return self.flow_model.time_shift

    def time_grid(self, num_steps: int, time_shift: float | None = None) -> torch.Tensor:
        """``[num_steps + 1]`` times from 1 to 0: ``shift(linspace(1, 0, S + 1))`` for a given ``time_shift``,
        else the model's own default grid (a diffusers model's: its scheduler's sigmas)."""
        if time_shift is not None:
            return timesteps(num_steps, shift=time_shift)
        return self.flow_model.time_grid(num_steps)

    @property
    def device(self) -> torch.device:
        return self.flow_model.device

    @property
    def mean_flow(self) -> bool:
        """Whether the network predicts MeanFlow average velocities (takes an interval start ``r``)."""
        return self.flow_model.mean_flow

    @property
    def image_conditioned(self) -> bool:
        """Whether the model continues a given first frame (image-to-video): its conditioning needs images."""
        return getattr(self.flow_model, "image_conditioned", False)

    def encode(self, prompts: list[str], images: torch.Tensor | None = None) -> Any:
        """Conditioning rows for ``prompts`` (opaque to samplers and algorithms), with the first frames
        ``images`` ``[B, 3, H, W]`` in [0, 1] that an image-to-video model continues (and only then)."""
        if (images is not None) != self.image_conditioned:
            raise ValueError(
                "an image-to-video model needs a first frame per prompt"
                if self.image_conditioned
                else "first frames are given, but this model is not an image-to-video model"
            )
        if images is None:
            return self.flow_model.encode(prompts)
        return self.flow_model.encode(prompts, images)

    def unconditional(self, negative_prompt: str = "") -> Any:
        """The one-row conditioning CFG guides away from, encoded once per prompt."""
        if negative_prompt not in self._unconditional:
            self._unconditional[negative_prompt] = self.encode([negative_prompt])
        return self._unconditional[negative_prompt]

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Model-space samples to media in [0, 1] (images ``[B, 3, H, W]`` or clips ``[B, T, 3, H, W]``)."""
        return self.flow_model.decode(x)

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Starting noise in the sampler's layout, row ``i`` seeded by ``seeds[i]``."""
        return self.flow_model.initial_noise(seeds, device)

    # --- velocities ----------------------------------------------------------------------------------

    def velocity_of(self, role: str) -> VelocityFn:
        """``role``'s velocity function ``(x, t, cond, r=None) -> v`` (module docstring)."""

        def velocity(
            x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
        ) -> torch.Tensor:
            if r is not None and not self.mean_flow:
                raise ValueError(
                    "MeanFlow (an interval start r) needs a network that takes r; this model does not"
                )
            extra = {} if r is None else {"r": r}
            with self.copies.network(role) as network, autocast(x.device, self.autocast_dtype):
                v = self.flow_model.velocity(network, x, t, cond, **extra)
            return v if self.autocast_dtype is None else v.float()

        return velocity

    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The trained velocity (gradients flow)."""
        return self.velocity_of(TRAINED)(x, t, cond, r)

    def old_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.velocity_of(OLD)(x, t, cond, r)

    def reference_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.velocity_of(REFERENCE)(x, t, cond, r)

    def guided(self, role: str, guidance_scale: float, negative_prompt: str = "") -> VelocityFn:
        """``role``'s CFG velocity ``v_u + w (v_c - v_u)`` against ``negative_prompt`` (``w = 1``: unguided)."""
        if guidance_scale == 1.0:
            return self.velocity_of(role)
        return guided_velocity(self.velocity_of(role), guidance_scale, self.unconditional(negative_prompt))

    # --- training state ------------------------------------------------------------------------------

    @property
    def model(self) -> nn.Module:
        """The trained network as the optimizer and DDP see it."""
        return self.copies.model

    def prepare(self, wrapper: Callable[[nn.Module], nn.Module]) -> None:
        """Wrap the trained network (``accelerator.prepare``: DDP across processes)."""
        self.copies.wrap(wrapper)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.copies.trainable_parameters()

    def move_copies(self, decays: Mapping[str, float]) -> None:
        """``theta_role <- decay theta_role + (1 - decay) theta`` for each given role, then the EMA
        (``ema_decay``); the one place where copies move."""
        for role, decay in decays.items():
            self.copies.move(role, decay)
        if self.ema_decay > 0:
            self.copies.move(EMA, self.ema_decay)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A detached copy of the trained weights (all of them, or the LoRA adapter's)."""
        return self.copies.trained_state()

    def load_copy(self, role: str, state: dict[str, torch.Tensor]) -> None:
        """Set the moving copy ``role`` (``old``, ``rollout``, ``ema``) to a :meth:`snapshot`."""
        self.copies.load_role(role, state)

    def to(self, device: torch.device | str) -> Policy:
        self.flow_model.to(device)
        self.copies.to(device)
        return self

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return self.copies.state_dict()

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        self.copies.load_state_dict(state)

    def save_pretrained(self, directory: str | Path) -> None:
        """The tuned weights in the backend's loadable format (a shapes model directory, a diffusers
        ``transformer/``, or diffusers-format LoRA weights)."""
        self.copies.save_pretrained(directory, self.flow_model)


def make_policy(
    flow_model: FlowModel,
    copies: Sequence[str] = (OLD,),
    ema_decay: float = 0.0,
    model_config: Any = None,
    mixed_precision: str = "no",
) -> Policy:
    """A trainable policy over ``flow_model`` keeping ``copies``, the reference (and the EMA when
    ``ema_decay > 0``); ``model_config`` tells the backend how to keep them (LoRA rank, ...);
    ``mixed_precision`` as ``training.mixed_precision``."""
    roles = (*copies, REFERENCE, *((EMA,) if ema_decay > 0 else ()))
    weights = flow_model.weight_copies(model_config, roles)
    dtype = autocast_dtype(mixed_precision)
    low_precision_modules = getattr(flow_model, "low_precision_modules", None)
    if dtype is not None and low_precision_modules is not None and isinstance(weights, ModuleCopies):
        weights.keep_low_precision_copies(dtype, low_precision_modules)
    return Policy(flow_model, weights, ema_decay, dtype)


def build_policy(
    model_config: Any, copies: Sequence[str] = (OLD,), ema_decay: float = 0.0, mixed_precision: str = "no"
) -> Policy:
    """The trainable policy of a validated ``model`` section (the backend it names, loaded on the CPU),
    keeping the algorithm's ``copies``, the reference and the EMA."""
    from flowrl.models import backend_class

    flow_model = backend_class(model_config.backend).from_config(model_config)
    return make_policy(flow_model, copies, ema_decay, model_config, mixed_precision)
