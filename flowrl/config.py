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

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowrl.algorithms import AlgorithmConfig, algorithm_entry
from flowrl.algorithms.nft_config import NFTConfig
from flowrl.config_schema import ConfigError, build_section
from flowrl.config_schema import at_least as _at_least
from flowrl.config_schema import choice as _choice
from flowrl.learning_rate import LR_SCHEDULES
from flowrl.models import ShapesModelConfig, backend_class
from flowrl.yaml_reading import parse_yaml

__all__ = ["ConfigError", "TrainConfig", "apply_overrides", "build_config", "load_config"]


@dataclass
class SamplerConfig:
    """Rollouts: an ODE solver of ``samplers`` on a (shifted) time grid, CFG-free by default."""

    solver: str = field(default="euler", metadata=_choice("euler", "heun", "dpm2m"))
    num_steps: int = field(default=10, metadata=_at_least(1))
    #: SD3 time shift ``s`` of ``t' = s t / (1 + (s - 1) t)`` on ``linspace(1, 0, S + 1)``; None = the model's own
    #: default grid (a diffusers model's: exactly its scheduler's sigmas for S steps; shapes: unshifted)
    time_shift: float | None = field(default=None, metadata=_at_least(0.0, strict=True))
    guidance_scale: float = field(default=1.0, metadata=_at_least(1.0))
    #: the prompt CFG guides away from (the unconditional branch of every guided velocity: rollouts,
    #: GRPO's guided training, CRD's anchor); "" = the empty prompt. Diffusers backends only: the shapes
    #: models were trained to drop their prompt to "" alone.
    negative_prompt: str = ""


@dataclass
class TrainingConfig:
    """Global batch sizes and optimisation. Images per step = ``prompts_per_step * group_size``."""

    steps: int = field(default=100, metadata=_at_least(1))
    prompts_per_step: int = field(default=8, metadata=_at_least(1))
    group_size: int = field(default=8, metadata=_at_least(2))
    micro_batch_size: int = field(default=32, metadata=_at_least(1))
    #: optimizer updates per rollout batch; each takes the same share of every process's (timestep x
    #: micro-batch) units, so with more than one the samples that share an update depend on the number
    #: of processes (same data and sizes, not bit-identical across process counts)
    updates_per_step: int = field(default=1, metadata=_at_least(1))
    learning_rate: float = field(default=3e-4, metadata=_at_least(0.0, strict=True))
    #: optimizer steps of linear warm-up
    warmup_steps: int = field(default=0, metadata=_at_least(0))
    #: after warm-up: "constant", or "cosine" decay to ``min_learning_rate_ratio`` of the peak at the last
    #: optimizer step (``steps * updates_per_step``)
    lr_schedule: str = field(default="constant", metadata=_choice(*LR_SCHEDULES))
    min_learning_rate_ratio: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    weight_decay: float = field(default=0.0, metadata=_at_least(0.0))
    adam_beta2: float = field(default=0.999, metadata={"min": 0.0, "max": 1.0})
    grad_clip: float = field(default=1.0, metadata=_at_least(0.0, strict=True))
    ema_decay: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    seed: int = field(default=0, metadata=_at_least(0))
    threads: int = field(default=0, metadata=_at_least(0))
    #: steps in a row whose update may be skipped (non-finite loss or gradients, or a reward batch an
    #: ``on_error: skip_batch`` reward failed) before the run stops with an error
    max_consecutive_skips: int = field(default=5, metadata=_at_least(1))


@dataclass
class DataConfig:
    """Training prompts: ``shapes-train`` or ``video-shapes-train`` (the shipped splits of the shapes
    and moving-shapes worlds) or a ``.jsonl``/``.txt`` file.

    ``sampling``: "uniform" draws every prompt equally often; "balanced" gives
    every ``tag`` (task) the same share of draws, as a per-task average score
    such as GenEval's weighs them (the shapes train split is 74% colour
    attribution prompts and 1% single-object prompts).

    ``task_weights`` (with "balanced"): relative shares per tag, 1 for a tag not
    named, e.g. ``{single_object: 0.5, colors: 0.5}`` draws the two tasks the
    base already solves half as often as each other task.
    """

    prompts: str = "shapes-train"
    sampling: str = field(default="uniform", metadata=_choice("uniform", "balanced"))
    task_weights: dict[str, float] = field(default_factory=dict)


@dataclass
class LoggingConfig:
    """Where the run goes and how often it reports."""

    output_dir: str = "runs/shapes_nft"
    tracker: str = field(default="none", metadata=_choice("none", "tensorboard", "wandb"))
    sample_every: int = field(default=10, metadata=_at_least(0))
    checkpoint_every: int = field(default=10, metadata=_at_least(0))
    keep_checkpoints: int = field(default=2, metadata=_at_least(1))
    progress: bool = True


@dataclass
class EvaluationConfig:
    """Held-out GenEval-style evaluation (shapes models): before training, every ``every`` steps, at the end.

    ``world``: ``shapes`` (images) or ``video_shapes`` (clips) — whose test
    prompts and verifier judge the model; None = the world of ``data.prompts``
    (``shapes`` for a prompt file).
    """

    world: str | None = field(default=None, metadata=_choice(None, "shapes", "video_shapes"))

    every: int = field(default=0, metadata=_at_least(0))
    images_per_task: int = field(default=64, metadata=_at_least(1))
    num_steps: int = field(default=20, metadata=_at_least(1))
    guidance_scales: list[float] = field(default_factory=lambda: [1.0])
    base_guidance_scales: list[float] = field(default_factory=lambda: [1.0, 3.0])


@dataclass
class TrainConfig:
    """A whole training run."""

    #: the backend's own config dataclass (:mod:`flowrl.models`), chosen by ``model.backend``
    model: Any = field(default_factory=ShapesModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    rewards: dict[str, Any] = field(default_factory=lambda: {"shapes_verifier": 1.0})
    reward_aggregation: str = field(default="sum", metadata=_choice("sum", "gdpo"))
    #: the algorithm's own config dataclass (:mod:`flowrl.algorithms`), chosen by ``algorithm.name``
    algorithm: AlgorithmConfig = field(default_factory=NFTConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    resume: str | None = None

    @property
    def evaluation_world(self) -> str | None:
        """The world evaluation uses: ``evaluation.world``, else the one of shipped ``data.prompts``, else
        None (the trainer then takes the model's: clips or images)."""
        if self.evaluation.world is not None:
            return self.evaluation.world
        return WORLD_OF_PROMPTS.get(self.data.prompts)

    @property
    def images_per_step(self) -> int:
        return self.training.prompts_per_step * self.training.group_size

    def per_process(self, num_processes: int) -> tuple[int, int]:
        """``(images per process, gradient-accumulation micro-batches)`` for ``num_processes``.

        The global batch must split evenly over processes, and each share into micro-batches.
        """
        images = self.images_per_step
        if images % num_processes:
            raise ConfigError(
                f"training.prompts_per_step * training.group_size = {images} images per step "
                f"does not divide over {num_processes} processes"
            )
        local = images // num_processes
        micro = min(self.training.micro_batch_size, local)
        if local % micro:
            raise ConfigError(
                f"training.micro_batch_size={self.training.micro_batch_size} does not divide the "
                f"{local} images per process ({images} per step over {num_processes} processes)"
            )
        return local, local // micro

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: the shipped training prompts (``data.prompts``) and their world (:mod:`flowrl.worlds`)
WORLD_OF_PROMPTS: dict[str, str] = {"shapes-train": "shapes", "video-shapes-train": "video_shapes"}


# --- loading ------------------------------------------------------------------------------------


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
    config = build_section(TrainConfig, data, "")
    algorithm = algorithm_entry(sections["algorithm"].get("name", "nft"))
    config.algorithm = build_section(algorithm.config, sections["algorithm"], "algorithm.")
    backend = backend_class(sections["model"].get("backend", "shapes"))
    config.model = build_section(backend.config_class, sections["model"], "model.")
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
