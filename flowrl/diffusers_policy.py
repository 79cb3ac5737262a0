"""The diffusers policy backend: SD3/SD3.5, FLUX or Wan 2.1 with peft LoRA (or full fine-tuning).

LoRA (``lora_rank > 0``): one transformer carries three peft adapters on the
same target modules and no second copy of the base weights:

- ``default`` — trained (float32 even when the base runs in bf16/fp16);
- ``old`` — the sampling policy, moved by ``theta_old <- d theta_old + (1 - d) theta``;
- ``sampler`` — only when the algorithm decouples sampling from ``old`` (CRD):
  the rollout policy, with its own update schedule;
- ``ema`` — the weight average saved as the tuned model (only with ``ema_decay > 0``);

and the **reference** is the base: the same transformer with its adapters
disabled. Whichever adapter a call needs is switched on for that call only;
``default`` is active again on return, so that gradient checkpointing
recomputes the trained forward with the trained adapter.

Full fine-tuning (``lora_rank = 0``) trains the transformer itself and keeps
explicit frozen copies for ``old``, ``reference`` (and ``ema``).

The tuned LoRA is saved in diffusers' format
(``pytorch_lora_weights.safetensors``, keys prefixed ``transformer.``, the
peft config in the file's metadata), so ``pipe.load_lora_weights(dir)`` on a
stock pipeline reproduces the tuned model.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from flowrl.models.diffusers_model import DiffusersFlowModel
from samplers import ODE_SOLVERS, guided_velocity, timesteps

TRAINED, OLD, SAMPLER, EMA = "default", "old", "sampler", "ema"


class DiffusersPolicy:
    """A diffusers flow model with its trained, old, reference and EMA velocities (see module docstring)."""

    def __init__(
        self,
        backend: DiffusersFlowModel,
        lora_rank: int = 32,
        lora_alpha: float = 64.0,
        lora_target_modules: Sequence[str] = (),
        ema_decay: float = 0.0,
        gradient_checkpointing: bool = False,
        separate_sampler: bool = False,
    ) -> None:
        self.backend = backend
        self.ema_decay = ema_decay
        self.lora_rank = lora_rank
        self.separate_sampler = separate_sampler
        transformer = backend.transformer
        transformer.requires_grad_(False)
        if gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        self.old = self.sampler = self.reference = self.ema = None
        if lora_rank:
            from peft import LoraConfig

            self.lora_config = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha,
                init_lora_weights="gaussian",
                target_modules=list(lora_target_modules or backend.default_lora_targets),
            )
            adapters = (
                [TRAINED, OLD] + ([SAMPLER] if separate_sampler else []) + ([EMA] if ema_decay > 0 else [])
            )
            for name in adapters:
                with (
                    warnings.catch_warnings()
                ):  # peft warns that a second adapter is added: it is meant to be
                    warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                    transformer.add_adapter(copy.deepcopy(self.lora_config), adapter_name=name)
            self._adapter_parameters = {name: self._named_adapter_parameters(name) for name in adapters}
            for name, parameters in self._adapter_parameters.items():
                for parameter in parameters.values():
                    parameter.data = parameter.data.float()
                    parameter.requires_grad_(name == TRAINED)
            with torch.no_grad():
                for name in adapters[1:]:
                    self._copy_adapter(TRAINED, name)
            transformer.set_adapter(TRAINED)
        else:
            transformer.requires_grad_(True)
            self.old = _frozen_copy(transformer)
            self.sampler = _frozen_copy(transformer) if separate_sampler else self.old
            self.reference = _frozen_copy(transformer)
            self.ema = _frozen_copy(transformer) if ema_decay > 0 else None
        transformer.train()
        #: the trained network (replaced by its DDP wrapper after ``accelerator.prepare``)
        self.model: nn.Module = transformer

    # --- adapters ------------------------------------------------------------------------------------

    @property
    def unwrapped(self) -> nn.Module:
        return getattr(self.model, "module", self.model)

    def _named_adapter_parameters(self, adapter: str) -> dict[str, nn.Parameter]:
        """An adapter's parameters by name with the adapter's name taken out (so adapters line up)."""
        marker = f".{adapter}."
        return {
            name.replace(marker, "."): parameter
            for name, parameter in self.backend.transformer.named_parameters()
            if marker in name and ".lora_" in name
        }

    def _copy_adapter(self, source: str, target: str) -> None:
        targets = self._adapter_parameters[target]
        for name, parameter in self._adapter_parameters[source].items():
            targets[name].copy_(parameter.detach())

    @contextlib.contextmanager
    def _active(self, adapter: str | None) -> Iterator[None]:
        """Run with only ``adapter`` on (None: adapters disabled = the base); ``default`` on again after."""
        transformer = self.backend.transformer
        if adapter is None:
            transformer.disable_adapters()
        elif adapter != TRAINED:
            transformer.set_adapter(adapter)
        try:
            yield
        finally:
            if adapter is None:
                transformer.enable_adapters()
            transformer.set_adapter(TRAINED)  # also gives the trained adapter its requires_grad back

    # --- velocities ----------------------------------------------------------------------------------

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.backend.sample_shape

    @property
    def time_shift(self) -> float:
        return self.backend.time_shift

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, ...]:
        return self.backend.encode(prompts)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.decode(x)

    def initial_noise(self, seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
        return self.backend.initial_noise(seeds, device)

    def velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_interval(r)
        return self.backend.velocity(self.model, x, t, cond)

    def old_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_interval(r)
        if self.lora_rank:
            with self._active(OLD):
                return self.backend.velocity(self.backend.transformer, x, t, cond)
        return self.backend.velocity(self.old, x, t, cond)

    def sampler_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_interval(r)
        """The rollout policy: the ``sampler`` copy when decoupled, else ``old``."""
        if self.lora_rank:
            with self._active(SAMPLER if self.separate_sampler else OLD):
                return self.backend.velocity(self.backend.transformer, x, t, cond)
        return self.backend.velocity(self.sampler, x, t, cond)

    def reference_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_interval(r)
        if self.lora_rank:
            with self._active(None):
                return self.backend.velocity(self.backend.transformer, x, t, cond)
        return self.backend.velocity(self.reference, x, t, cond)

    def tuned_velocity(
        self, x: torch.Tensor, t: torch.Tensor, cond: Any, r: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_interval(r)
        """The velocity of the model that is saved: the EMA when kept, else the trained weights."""
        if self.lora_rank:
            with self._active(EMA if self.ema_decay > 0 else TRAINED):
                return self.backend.velocity(self.backend.transformer, x, t, cond)
        return self.backend.velocity(self.ema if self.ema is not None else self.unwrapped, x, t, cond)

    # --- training state ------------------------------------------------------------------------------

    def to(self, device: torch.device | str) -> DiffusersPolicy:
        self.backend.to(device)
        for copy_ in (self.old, self.sampler, self.reference, self.ema):
            if copy_ is not None:
                copy_.to(device)
        return self

    def trainable_parameters(self) -> list[nn.Parameter]:
        if self.lora_rank:
            return list(self._adapter_parameters[TRAINED].values())
        return [p for p in self.unwrapped.parameters() if p.requires_grad]

    def _pairs(self, target: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(target, trained)`` parameter pairs for the old, sampler or EMA weights."""
        if self.lora_rank:
            trained = self._adapter_parameters[TRAINED]
            return ((p, trained[name]) for name, p in self._adapter_parameters[target].items())
        copy_ = {OLD: self.old, SAMPLER: self.sampler, EMA: self.ema}[target]
        return zip(copy_.parameters(), self.unwrapped.parameters())

    @torch.no_grad()
    def update_old(self, decay: float) -> None:
        """``theta_old <- decay * theta_old + (1 - decay) * theta``."""
        for old, new in self._pairs(OLD):
            old.lerp_(new.detach().to(old.dtype), 1 - decay)

    @torch.no_grad()
    def update_sampler(self, decay: float) -> None:
        """``theta_sampler <- decay * theta_sampler + (1 - decay) * theta`` (a separate sampler only)."""
        if not self.separate_sampler:
            raise RuntimeError("this policy samples with its old copy; build it with separate_sampler=True")
        for sampler, new in self._pairs(SAMPLER):
            sampler.lerp_(new.detach().to(sampler.dtype), 1 - decay)

    @torch.no_grad()
    def update_ema(self) -> None:
        """``theta_ema <- d * theta_ema + (1 - d) * theta`` (no-op without EMA)."""
        if self.ema_decay > 0:
            for ema, new in self._pairs(EMA):
                ema.lerp_(new.detach().to(ema.dtype), 1 - self.ema_decay)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """LoRA: every adapter's tensors; full fine-tuning: the trained, old and EMA networks."""
        if self.lora_rank:
            return {
                name: {key: p.detach().clone() for key, p in parameters.items()}
                for name, parameters in self._adapter_parameters.items()
            }
        state = {"model": self.unwrapped.state_dict(), "old": self.old.state_dict()}
        if self.separate_sampler:
            state["sampler"] = self.sampler.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        if self.lora_rank:
            for name, parameters in self._adapter_parameters.items():
                if set(state[name]) != set(parameters):
                    raise ValueError(f"checkpoint adapter {name!r} does not match this model's LoRA layers")
                for key, parameter in parameters.items():
                    parameter.copy_(state[name][key])
            return
        self.unwrapped.load_state_dict(state["model"])
        self.old.load_state_dict(state["old"])
        if self.separate_sampler:
            self.sampler.load_state_dict(state["sampler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])

    # --- sampling and saving -------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        prompts: Sequence[str],
        seeds: Sequence[int],
        num_steps: int,
        guidance_scale: float = 1.0,
        model: str = "tuned",
        batch_size: int = 16,
        negative_prompt: str = "",
        time_shift: float | None = None,
    ) -> torch.Tensor:
        """Media in [0, 1] (images, or Wan's videos) from the ``tuned`` or ``base`` model: Euler on the grid
        shifted by ``time_shift`` (None: the model's own), noise of sample ``i`` seeded by ``seeds[i]``, CFG
        against ``negative_prompt`` when ``guidance_scale > 1``."""
        velocity = {"tuned": self.tuned_velocity, "base": self.reference_velocity}[model]
        grid = timesteps(num_steps, shift=self.time_shift if time_shift is None else time_shift)
        guided = guided_velocity(velocity, guidance_scale, self.encode([negative_prompt]))
        images = []
        for start in range(0, len(prompts), batch_size):
            cond = self.encode(list(prompts[start : start + batch_size]))
            noise = self.initial_noise(seeds[start : start + batch_size], self.backend.device)
            images.append(self.decode(ODE_SOLVERS["euler"](guided, noise, grid, cond).x0))
        return torch.cat(images)

    def save_pretrained(self, directory: str | Path) -> None:
        """LoRA: ``pytorch_lora_weights.safetensors`` in diffusers' format; full: the tuned ``transformer/``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if not self.lora_rank:
            (self.ema if self.ema is not None else self.unwrapped).save_pretrained(directory / "transformer")
            return
        from peft.utils import get_peft_model_state_dict

        adapter = EMA if self.ema_decay > 0 else TRAINED
        layers = get_peft_model_state_dict(self.backend.transformer, adapter_name=adapter)
        self.backend.pipeline_class().save_lora_weights(
            directory,
            transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=self.lora_config.to_dict(),
        )


def _no_interval(r: torch.Tensor | None) -> None:
    if r is not None:
        raise ValueError(
            "MeanFlow (an interval start r) needs a network that takes r; SD3, FLUX and Wan do not"
        )


def _frozen_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).eval().requires_grad_(False)
