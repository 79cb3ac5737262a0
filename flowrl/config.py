"""Typed, validated training configs loaded from YAML.

A config file is a mapping of sections (``model``, ``sampler``, ``rewards``,
``algorithm``, ``training``, ``data``, ``logging``, ``evaluation``) plus an
optional ``defaults: [other.yaml, ...]`` list of files it extends (paths
relative to it; later entries and the file itself win, mappings merge key by
key). Command-line overrides are ``section.key=value`` with ``value`` read as
YAML (``training.steps=50``, ``evaluation.guidance_scales=[1,3]``).

The ``algorithm`` and ``model`` sections belong to their algorithm and
backend: ``algorithm.name`` picks a registered algorithm
(:mod:`flowrl.algorithms`) and ``model.backend`` a registered backend
(:mod:`flowrl.models`), and each brings its own config dataclass and
``check``. A key the chosen one does not have is an error. When a file
changes ``algorithm.name`` (or ``model.backend``) from the file it extends,
that section starts fresh instead of merging the other algorithm's keys.

Built on dataclasses and PyYAML rather than a config library: the schema is
the code, type checks and messages are ours (every error names the key, the
value and what is allowed), and it adds no dependency. Everything is checked
by :func:`load_config` before any model loads; what needs the process count
(global batch divisibility) is checked by :meth:`TrainConfig.per_process`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowrl.algorithms import algorithm_entry
from flowrl.config_schema import ConfigError, build_section
from flowrl.models import backend_class
from flowrl.train_config import (
    WORLD_OF_PROMPTS,
    DataConfig,
    EvaluationConfig,
    LoggingConfig,
    SamplerConfig,
    TrainConfig,
    TrainingConfig,
)
from flowrl.yaml_reading import parse_yaml

__all__ = [
    "ConfigError",
    "DataConfig",
    "EvaluationConfig",
    "LoggingConfig",
    "SamplerConfig",
    "TrainConfig",
    "TrainingConfig",
    "apply_overrides",
    "build_config",
    "load_config",
]


#: sections whose selector key picks their schema: a change of selector starts the section afresh
SELECTORS = {"algorithm": "name", "model": "backend"}


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else in ``update`` replaces; an ``algorithm``
    (``model``) section naming another algorithm (backend) than ``base`` replaces it whole."""
    merged = dict(base)
    for key, value in update.items():
        old = merged.get(key)
        selector = SELECTORS.get(key)
        changed = (
            selector is not None
            and isinstance(old, dict)
            and isinstance(value, dict)
            and selector in value
            and value[selector] != old.get(selector, value[selector])
        )
        if isinstance(value, dict) and isinstance(old, dict) and key != "rewards" and not changed:
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged


def read_yaml_with_defaults(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of ``path`` merged over the files its ``defaults`` list names."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"config defaults form a cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; give a YAML file (see configs/)")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"config file {path} is not UTF-8 text ({error.reason} at byte {error.start})"
        ) from None
    data = parse_yaml(text, f"config file {path}") or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    defaults = data.pop("defaults", []) or []
    if isinstance(defaults, str):
        defaults = [defaults]
    if not isinstance(defaults, list) or not all(isinstance(default, str) for default in defaults):
        raise ConfigError(
            f"config file {path}: defaults={defaults!r} is not allowed; expected a list of paths"
        )
    merged: dict[str, Any] = {}
    for default in defaults:
        merged = _merge(merged, read_yaml_with_defaults(path.parent / default, (*_seen, path)))
    return _merge(merged, data)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``section.key=value`` overrides (value parsed as YAML) applied to a raw config mapping."""
    data = dict(data)
    for override in overrides:
        dotted, separator, raw = override.partition("=")
        if not separator or not dotted:
            raise ConfigError(f"override {override!r} is not key=value (e.g. training.steps=50)")
        keys = dotted.split(".")
        if not all(keys):
            raise ConfigError(f"override {override!r} has an empty key; write section.key=value")
        value = parse_yaml(raw, f"override {override!r}")
        node = data
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is not None and not isinstance(child, dict):
                raise ConfigError(
                    f"override {override!r}: {'.'.join(keys[: depth + 1])} is a value ({child!r}), "
                    "not a section with keys"
                )
            node[key] = dict(child or {})
            node = node[key]
        node[keys[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A validated :class:`TrainConfig` from a YAML file (or the defaults) and overrides."""
    data = read_yaml_with_defaults(path) if path is not None else {}
    return build_config(apply_overrides(data, overrides or []))


def build_config(data: dict[str, Any]) -> TrainConfig:
    """Check a raw mapping against the schema and build the config (errors name the key)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {data!r}")
    data = dict(data)
    sections = {key: data.pop(key, None) or {} for key in SELECTORS}
    for key, section in sections.items():
        if not isinstance(section, dict):
            raise ConfigError(f"{key} must be a mapping, got {section!r}")
    algorithm = algorithm_entry(sections["algorithm"].get("name", "nft"))
    backend = backend_class(sections["model"].get("backend", "shapes"))
    config = build_section(
        TrainConfig,
        data,
        "",
        algorithm=build_section(algorithm.config, sections["algorithm"], "algorithm."),
        model=build_section(backend.config_class, sections["model"], "model."),
    )
    _check_cross_fields(config)
    return config


def _check_cross_fields(config: TrainConfig) -> None:
    """Rules that involve several keys or other registries (rewards, prompt files)."""
    from rewards import MultiReward

    try:
        MultiReward.check_spec(config.rewards)
    except ValueError as error:
        raise ConfigError(f"rewards: {error}") from error
    for scale in (*config.evaluation.guidance_scales, *config.evaluation.base_guidance_scales):
        if scale < 1.0:
            raise ConfigError(
                f"evaluation guidance scale {scale} is not allowed; it must be >= 1 (1 = no CFG)"
            )
    prompts = config.data.prompts
    if prompts not in WORLD_OF_PROMPTS and not (
        Path(prompts).suffix in (".jsonl", ".txt") and Path(prompts).is_file()
    ):
        raise ConfigError(
            f"data.prompts={prompts!r} is not allowed; use one of {list(WORLD_OF_PROMPTS)} or an existing "
            ".jsonl/.txt file"
        )
    _check_task_weights(config.data)
    implied = WORLD_OF_PROMPTS.get(prompts)
    if implied and config.evaluation.world not in (None, implied):
        raise ConfigError(
            f"evaluation.world={config.evaluation.world!r} does not match data.prompts={prompts!r} "
            f"(prompts of the {implied!r} world); set evaluation.world={implied} or leave it unset"
        )
    backend_class(config.model.backend).check(config)
    config.algorithm.check(config)


def _check_task_weights(data: DataConfig) -> None:
    """``data.task_weights``: only with balanced sampling, weights >= 0, tags of the prompts (read here,
    before any model loads)."""
    from flowrl.prompts import load_prompts, prompt_weights

    if not data.task_weights:
        return
    negative = {tag: weight for tag, weight in data.task_weights.items() if weight < 0}
    if negative:
        raise ConfigError(f"data.task_weights {negative} are not allowed; every weight must be >= 0")
    try:
        prompt_weights(load_prompts(data.prompts), data.sampling, data.task_weights)
    except ValueError as error:
        raise ConfigError(f"data.task_weights: {error}") from error
