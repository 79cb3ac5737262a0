"""Reward registry: names to reward functions or classes, with third-party plugins.

Three ways to name a reward wherever a reward name is accepted:
  - a name registered with ``@register("name")`` (built-ins and your own code);
  - a name a third-party package exposes through the entry-point group
    ``flowrl.rewards`` (``[project.entry-points."flowrl.rewards"] my_reward =
    "my_pkg.rewards:MyReward"``), loaded on first use;
  - a dotted path ``"package.module:Attribute"``.
``build_reward(name, **settings)`` returns a ready callable: a class is
instantiated with the settings, a function is returned as is.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, TypeVar

RewardFactory = TypeVar("RewardFactory", bound=Callable[..., Any])

ENTRY_POINT_GROUP = "flowrl.rewards"
#: Name -> reward function or class, or a dotted path not imported yet (``register_lazy``).
_REGISTRY: dict[str, Callable[..., Any] | str] = {}


def register(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering a reward function or class under ``name``."""

    def decorator(factory: RewardFactory) -> RewardFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"reward name {name!r} is already registered to {_REGISTRY[name]!r}")
        _REGISTRY[name] = factory
        return factory

    return decorator


def register_lazy(name: str, path: str) -> None:
    """Register ``name`` as the dotted path ``"package.module:Attribute"``, imported on first use.

    Built-ins with heavy dependencies (open_clip, transformers, onnxruntime) use this,
    so that importing ``rewards`` stays cheap.
    """
    if name in _REGISTRY and _REGISTRY[name] != path:
        raise ValueError(f"reward name {name!r} is already registered to {_REGISTRY[name]!r}")
    _REGISTRY[name] = path


def _plugins() -> dict[str, Any]:
    return {entry.name: entry for entry in entry_points(group=ENTRY_POINT_GROUP)}


def available_rewards() -> list[str]:
    """Names of all registered and plugin rewards, sorted."""
    return sorted(set(_REGISTRY) | set(_plugins()))


def resolve_reward(name: str) -> Callable[..., Any]:
    """The function or class a reward name stands for (registered, plugin, or dotted path)."""
    if name in _REGISTRY:
        if isinstance(_REGISTRY[name], str):
            _REGISTRY[name] = _import(_REGISTRY[name], name)
        return _REGISTRY[name]
    plugins = _plugins()
    if name in plugins:
        try:
            factory = plugins[name].load()
        except Exception as error:
            raise ValueError(
                f"reward plugin {name!r} ({plugins[name].value}) failed to load: {error}"
            ) from error
        _REGISTRY[name] = factory
        return factory
    if ":" in name:
        return _import(name, name)
    raise ValueError(
        f"unknown reward {name!r}; available: {available_rewards()} (or a dotted path 'package.module:Name')"
    )


def _import(path: str, name: str) -> Callable[..., Any]:
    module_name, _, attribute = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import reward {name!r} from {path!r}: {error}") from error


def check_settings(name: str, settings: Mapping[str, Any]) -> None:
    """Check that the reward ``name`` takes ``settings`` (its class's ``__init__`` signature), without
    building it: a ``ValueError`` naming the settings and what the reward takes."""
    factory = resolve_reward(name)
    if not isinstance(factory, type):
        if settings:
            raise ValueError(f"reward {name!r} is a function and takes no settings, got {sorted(settings)}")
        return
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a C-implemented class without a signature: nothing to check
        return
    try:
        signature.bind(**settings)
    except TypeError as error:
        taken = [
            p for p, parameter in signature.parameters.items() if parameter.kind is not parameter.VAR_KEYWORD
        ]
        raise ValueError(
            f"reward {name!r} does not take settings {sorted(settings)} ({error}); it takes {taken or 'none'}"
        ) from None


def build_reward(name: str, **settings: Any) -> Callable[..., Any]:
    """The reward callable for ``name``; a class is instantiated with ``settings`` (checked first)."""
    check_settings(name, settings)
    factory = resolve_reward(name)
    if isinstance(factory, type):
        return factory(**settings)
    return factory


def outside_settings(name: str) -> tuple[str, ...]:
    """The settings of reward ``name`` that make it reach outside the process: a file it reads or an address
    it connects to, chosen by whoever writes the settings (a class attribute ``outside_settings``, e.g.
    ``("url",)`` for ``remote``); a program that builds rewards from settings it did not write (the demo, from
    a run's config.yaml) refuses those unless told to trust them."""
    return tuple(getattr(resolve_reward(name), "outside_settings", ()))


@dataclass(frozen=True)
class RewardInfo:
    """A row of ``flowrl rewards list``."""

    name: str
    modality: str
    weights: str
    source: str


def describe_rewards() -> list[RewardInfo]:
    """Every available reward with its modality and whether its weights are present.

    A class reward may define ``weights_status() -> str`` (a classmethod), e.g.
    ``"present: /path"`` or ``"missing: download ... to ..."``; otherwise
    ``"not needed"``. Rewards that fail to import (a plugin, or a built-in whose
    optional dependency is missing) are listed with the error and their source.
    """
    rows = []
    for name in available_rewards():
        source = "plugin" if name not in _REGISTRY else "registered"
        try:
            factory = resolve_reward(name)
        except ValueError as error:
            rows.append(RewardInfo(name, "?", f"{source} reward failed to load: {error}", source))
            continue
        status = factory.weights_status() if hasattr(factory, "weights_status") else "not needed"
        rows.append(RewardInfo(name, getattr(factory, "modality", "image"), status, source))
    return rows
