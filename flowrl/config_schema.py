"""The schema machinery of configs: field rules, checked building of a dataclass section, ConfigError.

A leaf module (no ``flowrl`` imports), so that algorithm and backend config
dataclasses can live beside their code (:mod:`flowrl.algorithms`,
:mod:`flowrl.models`) and :mod:`flowrl.config` can assemble them without an
import cycle. Rules are ``dataclasses.field`` metadata: ``choice(...)``,
``at_least(x)``, or ``{"min": .., "max": ..}``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A config value that is not allowed; the message names the key, the value and what is allowed."""


def choice(*allowed: Any) -> dict[str, Any]:
    """Field rule: the value must be one of ``allowed``."""
    return {"choices": allowed}


def at_least(minimum: float, strict: bool = False) -> dict[str, Any]:
    """Field rule: the value must be ``>= minimum`` (``>`` when ``strict``)."""
    return {"min": minimum, "strict": strict}


def build_section(cls: type, data: Any, prefix: str, **given: Any) -> Any:
    """Check a raw mapping against the dataclass ``cls`` and build it; errors name ``prefix + key``.
    ``given`` are fields already built (e.g. the ``model`` and ``algorithm`` sections), not read from ``data``."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - (set(known) - set(given)))
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]}; allowed under {prefix.rstrip('.') or 'the top level'}: "
            f"{sorted(known)}"
        )
    values = {}
    for name, value in data.items():
        key = f"{prefix}{name}"
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            values[name] = build_section(kind, value, f"{key}.")
        else:
            values[name] = _check_value(key, value, kind, known[name].metadata)
    return cls(**values, **given)


def _check_value(key: str, value: Any, kind: Any, rules: typing.Mapping[str, Any]) -> Any:
    value = _coerce(key, value, kind)
    if value is None:  # allowed by an ``X | None`` type (``_coerce`` refused it otherwise); no bounds apply
        return value
    if "choices" in rules and value not in rules["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {list(rules['choices'])}")
    if "min" in rules:
        low, strict = rules["min"], rules.get("strict", False)
        if value < low or (strict and value == low):
            raise ConfigError(f"{key}={value!r} is not allowed; it must be {'>' if strict else '>='} {low}")
    if "max" in rules and value > rules["max"]:
        raise ConfigError(f"{key}={value!r} is not allowed; it must be <= {rules['max']}")
    return value


def _finite_number(key: str, value: Any) -> float:
    """``value`` as a finite float (ints and numeric strings accepted: YAML 1.1 reads "1e-4" as a string);
    NaN and infinities are refused, in any spelling (``.nan``, ``.inf``, ``"nan"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key}={value!r} is not allowed; expected a number")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r} is not allowed; expected a number") from None
    if not math.isfinite(number):
        raise ConfigError(f"{key}={value!r} is not allowed; expected a finite number")
    return number


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """``value`` as ``kind`` (int accepted for float; ``X | None`` accepts None), else a ConfigError."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(kind)
        if value is None and type(None) in options:
            return None
        return _coerce(key, value, next(option for option in options if option is not type(None)))
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} is not allowed; expected a list")
        (item,) = typing.get_args(kind)
        return [_coerce(f"{key}[{index}]", element, item) for index, element in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r} is not allowed; expected a mapping")
        key_kind, value_kind = typing.get_args(kind)
        if value_kind is Any:
            return dict(value)
        return {
            _coerce(key, name, key_kind): _coerce(f"{key}.{name}", element, value_kind)
            for name, element in value.items()
        }
    if kind is float:
        return _finite_number(key, value)
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not allowed; expected true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r} is not allowed; expected an integer")
    if not isinstance(value, kind):
        raise ConfigError(f"{key}={value!r} is not allowed; expected {kind.__name__}")
    return value
