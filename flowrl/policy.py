"""The shapes policy backend: a fully fine-tuned ShapesDiT with explicit old, reference and EMA copies.

``model`` is trained (and may be replaced by its DDP wrapper after
``accelerator.prepare``); ``old`` anchors DiffusionNFT's implicit policies
and samples the rollouts, unless the algorithm decouples a separate
``sampler`` copy (CRD) with its own update schedule; ``reference`` is the frozen base; ``ema``
(when ``ema_decay > 0``) is the weight average saved as the tuned model.
Copies are cheap here (2.6M parameters); LoRA backends keep adapters instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flowrl.generate import generate, model_space_to_images, seeded_noise
from flowrl.models.shapes_dit import ShapesDiT


def _frozen_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).eval().requires_grad_(False)


class ShapesPolicy:
    """Trainable ShapesDiT plus its old, reference and EMA copies (see module docstring)."""

    def __init__(self, base: ShapesDiT, ema_decay: float = 0.0, separate_sampler: bool = False) -> None:
        self.model: nn.Module = base.train().requires_grad_(True)
        self.old = _frozen_copy(base)
        self.sampler = _frozen_copy(base) if separate_sampler else self.old
        self.reference = _frozen_copy(base)
        self.ema_decay = ema_decay
        self.ema = _frozen_copy(base) if ema_decay > 0 else None
        self.sample_shape = base.sample_shape

    #: the shapes world is trained and sampled on the unshifted grid
    time_shift = 1.0

    def to(self, device: torch.device | str) -> ShapesPolicy:
        for model in (self.model, self.old, self.sampler, self.reference, self.ema):
            if model is not None:
                model.to(device)
        return self

    @property
    def unwrapped(self) -> ShapesDiT:
        """The trained network without its DDP wrapper."""
        return getattr(self.model, "module", self.model)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.unwrapped.encode_prompts(prompts)

    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.model(x, t, *cond, r=r)

    def old_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.old(x, t, *cond, r=r)

    def sampler_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.sampler(x, t, *cond, r=r)

    def reference_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.reference(x, t, *cond, r=r)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Model-space samples to images in [0, 1]."""
        return model_space_to_images(x)

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        """Standard normal pixels-space noise, row ``i`` seeded by ``seeds[i]``."""
        return seeded_noise(seeds, self.sample_shape, device)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _move_towards_trained(self, copy_: nn.Module, decay: float) -> None:
        """``theta_copy <- decay * theta_copy + (1 - decay) * theta``."""
        for target, new in zip(copy_.parameters(), self.unwrapped.parameters()):
            target.lerp_(new.detach(), 1 - decay)

    def update_old(self, decay: float) -> None:
        """``theta_old <- decay * theta_old + (1 - decay) * theta``."""
        self._move_towards_trained(self.old, decay)

    def update_sampler(self, decay: float) -> None:
        """``theta_sampler <- decay * theta_sampler + (1 - decay) * theta`` (a separate sampler only)."""
        if self.sampler is self.old:
            raise RuntimeError("this policy samples with its old copy; build it with separate_sampler=True")
        self._move_towards_trained(self.sampler, decay)

    def update_ema(self) -> None:
        """``theta_ema <- d * theta_ema + (1 - d) * theta`` (no-op without EMA)."""
        if self.ema is not None:
            self._move_towards_trained(self.ema, self.ema_decay)

    def tuned(self) -> ShapesDiT:
        """The network to evaluate and ship: the EMA when kept, else the trained weights."""
        return self.ema if self.ema is not None else self.unwrapped

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        state = {"model": self.unwrapped.state_dict(), "old": self.old.state_dict()}
        if self.sampler is not self.old:
            state["sampler"] = self.sampler.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        self.unwrapped.load_state_dict(state["model"])
        self.old.load_state_dict(state["old"])
        if self.sampler is not self.old:
            self.sampler.load_state_dict(state["sampler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])

    def generate(
        self,
        prompts: Sequence[str],
        seeds: Sequence[int],
        num_steps: int,
        guidance_scale: float = 1.0,
        model: str = "tuned",
    ) -> torch.Tensor:
        """Images in [0, 1] from the ``tuned`` or ``base`` model (see :func:`flowrl.generate.generate`)."""
        network = {"tuned": self.tuned, "base": lambda: self.reference}[model]()
        return generate(network, prompts, seeds, num_steps, guidance_scale)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the tuned network as a loadable ShapesDiT directory."""
        self.tuned().save_pretrained(directory)
