"""Where a policy's weight copies live: explicit module copies (full fine-tuning) or peft adapters (LoRA).

A policy trains one network and keeps copies of it in *roles*
(:mod:`flowrl.policy`): ``old``, ``rollout`` (only when an algorithm
decouples its rollouts from ``old``), ``reference`` (the frozen base) and
``ema``. Two strategies keep them:

- :class:`ModuleCopies` — frozen deep copies of the network (the shapes model
  is small; full fine-tuning of a diffusers transformer);
- :class:`AdapterCopies` — one diffusers transformer carrying one peft LoRA
  adapter per role (``default`` is trained, float32 even when the base runs in
  bf16/fp16) and no second copy of the base weights: the reference is the
  transformer with its adapters disabled. The adapter a call needs is switched
  on for that call only; ``default`` is active again on return, so that
  gradient checkpointing recomputes the trained forward with the trained adapter.
  The switch goes layer by layer through peft's own layer API (``set_adapter``,
  ``enable_adapters`` of each LoRA layer, listed once): diffusers' model-level
  ``set_adapter`` walks every module and re-reads peft's package metadata on each
  call: 3.4 ms a switch and back on the peer benchmark's tiny SD3, about 1 ms layer by layer.

Both give the same operations: the network of a role for one call, the
trainable parameters, ``theta_copy <- d theta_copy + (1 - d) theta``, a snapshot
of the trained weights and loading one into a moving copy (SePPO's pool of
earlier checkpoints), state dicts and saving the tuned weights.

Under mixed precision (``training.mixed_precision: bf16``) a :class:`ModuleCopies` can also keep, for each
frozen copy, a *compute copy* whose matrix-product layers hold their weights in bfloat16
(:meth:`ModuleCopies.keep_low_precision_copies`): autocast casts a frozen weight to bfloat16 at every call
(its cast cache holds only trainable leaves), and those casts were 14% of the main job's bf16 step. The
cast is the same rounding either way, so a role's velocity is bit-identical with or without its compute
copy; the float32 copy stays the master that moves and is saved.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

TRAINED, OLD, ROLLOUT, REFERENCE, EMA, TUNED = "trained", "old", "rollout", "reference", "ema", "tuned"
#: the copies that move towards the trained weights (the reference never moves)
MOVING = (OLD, ROLLOUT, EMA)


def _frozen_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).eval().requires_grad_(False)


class ModuleCopies:
    """The trained network plus a frozen deep copy per role (module docstring)."""

    def __init__(self, network: nn.Module, roles: Iterable[str], trainable: bool = True) -> None:
        #: the trained network (replaced by its DDP wrapper through :meth:`wrap`)
        self.model: nn.Module = network.train().requires_grad_(True) if trainable else network
        self.copies = {role: _frozen_copy(network) for role in roles}
        #: per role, the copy calls run on: the float32 copy, or its low-precision compute copy
        self.compute: dict[str, nn.Module] = dict(self.copies)

    def keep_low_precision_copies(
        self, dtype: torch.dtype, modules_of: Callable[[nn.Module], Iterable[nn.Module]]
    ) -> None:
        """Run every role on a compute copy whose ``modules_of(copy)`` hold ``dtype`` weights (module
        docstring); refreshed from the float32 copy whenever that moves or loads."""
        for role, module in self.copies.items():
            compute = _frozen_copy(module)
            for layer in modules_of(compute):
                layer.to(dtype)
            self.compute[role] = compute

    @torch.no_grad()
    def _refresh(self, role: str) -> None:
        compute = self.compute[role]
        if compute is not self.copies[role]:
            for target, master in zip(compute.parameters(), self.copies[role].parameters()):
                target.copy_(master)  # the cast, rounding as autocast's

    @property
    def unwrapped(self) -> nn.Module:
        return getattr(self.model, "module", self.model)

    def wrap(self, wrapper: Callable[[nn.Module], nn.Module]) -> None:
        """Replace the trained network by ``wrapper(network)`` (e.g. ``accelerator.prepare``)."""
        self.model = wrapper(self.model)

    def _role(self, role: str) -> str:
        if role == ROLLOUT and ROLLOUT not in self.copies:
            role = OLD
        if role not in self.copies:
            raise KeyError(f"this policy keeps no {role!r} copy; it keeps {sorted(self.copies)}")
        return role

    @contextlib.contextmanager
    def network(self, role: str) -> Iterator[nn.Module]:
        """The network that computes ``role``'s velocity (``tuned``: the EMA when kept, else the trained)."""
        if role == TRAINED:
            yield self.model
        elif role == TUNED:
            yield self.compute.get(EMA, self.unwrapped)
        else:
            yield self.compute[self._role(role)]

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @torch.no_grad()
    def move(self, role: str, decay: float) -> None:
        """``theta_role <- decay * theta_role + (1 - decay) * theta``."""
        if role == ROLLOUT and ROLLOUT not in self.copies:
            raise RuntimeError("this policy rolls out with its old copy; build it with a 'rollout' copy")
        role = self._role(role)
        for target, new in zip(self.copies[role].parameters(), self.unwrapped.parameters()):
            target.lerp_(new.detach().to(target.dtype), 1 - decay)
        self._refresh(role)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the trained weights (a snapshot that later updates do not change)."""
        return {key: value.detach().clone() for key, value in self.unwrapped.state_dict().items()}

    @torch.no_grad()
    def load_role(self, role: str, state: dict[str, torch.Tensor]) -> None:
        """Set a moving copy's weights to a snapshot of :meth:`trained_state`."""
        if role not in MOVING:
            raise KeyError(f"only a moving copy {MOVING} can load weights, not {role!r}")
        role = self._role(role)
        self.copies[role].load_state_dict(state)
        self._refresh(role)

    def to(self, device: torch.device | str) -> None:
        for module in (self.model, *self.copies.values(), *self.compute.values()):
            module.to(device)

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """The trained network (``model``) and every moving copy; the reference is the base and not saved."""
        state = {"model": self.unwrapped.state_dict()}
        state.update({role: module.state_dict() for role, module in self.copies.items() if role in MOVING})
        return state

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        self.unwrapped.load_state_dict(state["model"])
        for role, module in self.copies.items():
            if role in MOVING:
                module.load_state_dict(state[role])
                self._refresh(role)

    def save_pretrained(self, directory: str | Path, flow_model: Any) -> None:
        """The tuned network (EMA when kept) in the backend's own format, float32."""
        flow_model.save_network(self.copies.get(EMA, self.unwrapped), Path(directory))


class AdapterCopies:
    """One transformer with a peft LoRA adapter per role (module docstring)."""

    ADAPTERS = {TRAINED: "default", OLD: "old", ROLLOUT: "rollout", EMA: "ema"}

    def __init__(self, transformer: nn.Module, lora_config: Any, roles: Iterable[str]) -> None:
        self.transformer = transformer
        self.lora_config = lora_config
        roles = set(roles)
        adapters = [
            self.ADAPTERS[role] for role in (TRAINED, OLD, ROLLOUT, EMA) if role == TRAINED or role in roles
        ]
        for name in adapters:
            with warnings.catch_warnings():  # peft warns that a second adapter is added: it is meant to be
                warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                transformer.add_adapter(copy.deepcopy(lora_config), adapter_name=name)
        self._parameters = {name: self._named_adapter_parameters(name) for name in adapters}
        for name, parameters in self._parameters.items():
            for parameter in parameters.values():
                parameter.data = parameter.data.float()
                parameter.requires_grad_(name == self.ADAPTERS[TRAINED])
        with torch.no_grad():
            for name in adapters[1:]:
                self._copy_adapter(self.ADAPTERS[TRAINED], name)
        transformer.set_adapter(self.ADAPTERS[TRAINED])
        from peft.tuners.tuners_utils import BaseTunerLayer

        #: the transformer's LoRA layers, switched one by one (module docstring)
        self._lora_layers = [module for module in transformer.modules() if isinstance(module, BaseTunerLayer)]
        #: the trained network (replaced by its DDP wrapper through :meth:`wrap`)
        self.model: nn.Module = transformer

    def wrap(self, wrapper: Callable[[nn.Module], nn.Module]) -> None:
        self.model = wrapper(self.model)

    def _named_adapter_parameters(self, adapter: str) -> dict[str, nn.Parameter]:
        """An adapter's parameters by name with the adapter's name taken out (so adapters line up)."""
        marker = f".{adapter}."
        return {
            name.replace(marker, "."): parameter
            for name, parameter in self.transformer.named_parameters()
            if marker in name and ".lora_" in name
        }

    def _copy_adapter(self, source: str, target: str) -> None:
        targets = self._parameters[target]
        for name, parameter in self._parameters[source].items():
            targets[name].copy_(parameter.detach())

    def _adapter(self, role: str) -> str:
        if role == ROLLOUT and self.ADAPTERS[ROLLOUT] not in self._parameters:
            role = OLD
        if role == TUNED:
            role = EMA if self.ADAPTERS[EMA] in self._parameters else TRAINED
        name = self.ADAPTERS.get(role)
        if name not in self._parameters:
            raise KeyError(f"this policy keeps no {role!r} adapter; it keeps {sorted(self._parameters)}")
        return name

    @contextlib.contextmanager
    def network(self, role: str) -> Iterator[nn.Module]:
        """The transformer with only ``role``'s adapter on (reference: adapters disabled = the base);
        ``default`` on again after."""
        if role == TRAINED:
            yield self.model
            return
        adapter = None if role == REFERENCE else self._adapter(role)
        if adapter == self.ADAPTERS[TRAINED]:
            yield self.transformer
            return
        for layer in self._lora_layers:
            if adapter is None:
                layer.enable_adapters(False)
            else:
                layer.set_adapter(adapter)
        try:
            yield self.transformer
        finally:
            for layer in self._lora_layers:  # the trained adapter on again, and trainable again
                if adapter is None:
                    layer.enable_adapters(True)  # ``default`` stayed the active adapter
                else:
                    layer.set_adapter(self.ADAPTERS[TRAINED])

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self._parameters[self.ADAPTERS[TRAINED]].values())

    @torch.no_grad()
    def move(self, role: str, decay: float) -> None:
        """``theta_role <- decay * theta_role + (1 - decay) * theta`` on the adapters' weights."""
        if role == ROLLOUT and self.ADAPTERS[ROLLOUT] not in self._parameters:
            raise RuntimeError("this policy rolls out with its old adapter; build it with a 'rollout' copy")
        trained = self._parameters[self.ADAPTERS[TRAINED]]
        for name, target in self._parameters[self._adapter(role)].items():
            target.lerp_(trained[name].detach().to(target.dtype), 1 - decay)

    def trained_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the trained adapter's weights."""
        return {key: p.detach().clone() for key, p in self._parameters[self.ADAPTERS[TRAINED]].items()}

    @torch.no_grad()
    def load_role(self, role: str, state: dict[str, torch.Tensor]) -> None:
        """Set a moving copy's adapter to a snapshot of :meth:`trained_state`."""
        if role not in MOVING:
            raise KeyError(f"only a moving copy {MOVING} can load weights, not {role!r}")
        for key, parameter in self._parameters[self._adapter(role)].items():
            parameter.copy_(state[key])

    def to(self, device: torch.device | str) -> None:
        """The adapters live in the transformer: the flow model moves them."""

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """Every adapter's tensors."""
        return {
            name: {key: p.detach().clone() for key, p in parameters.items()}
            for name, parameters in self._parameters.items()
        }

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        for name, parameters in self._parameters.items():
            if set(state[name]) != set(parameters):
                raise ValueError(f"checkpoint adapter {name!r} does not match this model's LoRA layers")
            for key, parameter in parameters.items():
                parameter.copy_(state[name][key])

    def save_pretrained(self, directory: str | Path, flow_model: Any) -> None:
        """``pytorch_lora_weights.safetensors`` in diffusers' format (keys prefixed ``transformer.``, the peft
        config in the file's metadata), so ``pipe.load_lora_weights(dir)`` reproduces the tuned model."""
        from peft.utils import get_peft_model_state_dict

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        layers = get_peft_model_state_dict(self.transformer, adapter_name=self._adapter(TUNED))
        flow_model.pipeline_class().save_lora_weights(
            directory,
            transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=self.lora_config.to_dict(),
        )
