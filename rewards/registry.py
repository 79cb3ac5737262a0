"""Reward registry: names to reward functions or classes.

``@register("name")`` adds a function ``(media, prompts, metadata) -> Tensor[B] | dict``
or a class whose instances are such callables. ``build_reward(name)`` returns a
ready callable: classes are instantiated with the given keyword arguments. A
name of the form ``"package.module:Attribute"`` is imported instead of looked up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

RewardFactory = TypeVar("RewardFactory", bound=Callable[..., Any])

_REGISTRY: dict[str, Callable[..., Any]] = {}


def register(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering a reward function or class under ``name``."""

    def decorator(factory: RewardFactory) -> RewardFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"reward name {name!r} is already registered to {_REGISTRY[name]!r}")
        _REGISTRY[name] = factory
        return factory

    return decorator


def available_rewards() -> list[str]:
    """Names of all registered rewards, sorted."""
    return sorted(_REGISTRY)


def _resolve(name: str) -> Callable[..., Any]:
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"cannot import reward {name!r}: {error}") from error
    raise ValueError(
        f"unknown reward {name!r}; registered: {available_rewards()} "
        "(or give a dotted path 'package.module:Name')"
    )


def build_reward(name: str, **kwargs: Any) -> Callable[..., Any]:
    """The reward callable for ``name``; a registered class is instantiated with ``kwargs``."""
    factory = _resolve(name)
    if isinstance(factory, type):
        return factory(**kwargs)
    if kwargs:
        raise ValueError(f"reward {name!r} is a function and takes no settings, got {sorted(kwargs)}")
    return factory
