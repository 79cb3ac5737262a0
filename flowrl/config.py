"""Typed, validated training configs loaded from YAML.

A config file is a mapping of sections (``model``, ``sampler``, ``rewards``,
``algorithm``, ``training``, ``data``, ``logging``, ``evaluation``) plus an
optional ``defaults: [other.yaml, ...]`` list of files it extends (paths
relative to it; later entries and the file itself win, mappings merge key by
key). Command-line overrides are ``section.key=value`` with ``value`` read as
YAML (``training.steps=50``, ``evaluation.guidance_scales=[1,3]``).

Built on dataclasses and PyYAML rather than a config library: the schema is
the code, type checks and messages are ours (every error names the key, the
value and what is allowed), and it adds no dependency. Everything is checked
by :func:`load_config` before any model loads; what needs the process count
(global batch divisibility) is checked by :meth:`TrainConfig.per_process`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flowrl.learning_rate import LR_SCHEDULES


def _choice(*allowed: Any) -> dict[str, Any]:
    return {"choices": allowed}


def _at_least(minimum: float, strict: bool = False) -> dict[str, Any]:
    return {"min": minimum, "strict": strict}


@dataclass
class ModelConfig:
    """The policy backend and its model (one flat section; each key says which backends read it).

    ``shapes``: a shipped shapes model name (``shapes-base``) or a saved
    ShapesDiT directory, fully fine-tuned. ``sd3`` (SD3/SD3.5), ``flux``
    (FLUX.1) and ``wan`` (Wan 2.1 text-to-video): a diffusers
    ``from_pretrained`` id (read from the local HF cache when offline) or
    pipeline directory, trained through peft LoRA adapters (``lora_rank: 0``
    = full fine-tuning of the transformer).
    """

    name: str = "shapes-base"
    backend: str = field(default="shapes", metadata=_choice("shapes", "sd3", "flux", "wan"))
    #: the frozen weights' dtype (sd3, flux, wan); trainable LoRA weights stay float32
    dtype: str = field(default="float32", metadata=_choice("float32", "bfloat16", "float16"))
    # --- sd3, flux, wan
    height: int = field(default=512, metadata=_at_least(16))
    width: int = field(default=512, metadata=_at_least(16))
    #: wan: frames per clip, 4k+1 (the VAE folds 4 frames into a latent after the first; 1 = single frames)
    num_frames: int = field(default=81, metadata=_at_least(1))
    #: T5 text length in tokens (None = the model's default: 256 for SD3, 512 for FLUX and Wan)
    max_sequence_length: int | None = field(default=None, metadata=_at_least(1))
    #: FLUX.1-dev's embedded guidance value (models without a guidance input ignore it)
    guidance: float = field(default=3.5, metadata=_at_least(0.0))
    lora_rank: int = field(default=32, metadata=_at_least(0))
    lora_alpha: float = field(default=64.0, metadata=_at_least(0.0, strict=True))
    #: module name suffixes to adapt (empty = the attention projections of every block)
    lora_target_modules: list[str] = field(default_factory=list)
    gradient_checkpointing: bool = False
    #: a diffusers attention backend (``native`` = PyTorch SDPA, ``xformers``, ``flash``, ...); None = default
    attention_backend: str | None = None
    #: ``torch.compile`` the transformer
    compile: bool = False
    #: keep the text encoders on the CPU between prompt encodings
    offload_text_encoders: bool = True


@dataclass
class SamplerConfig:
    """Rollouts: an ODE solver of ``samplers`` on a (shifted) time grid, CFG-free by default."""

    solver: str = field(default="euler", metadata=_choice("euler", "heun", "dpm2m"))
    num_steps: int = field(default=10, metadata=_at_least(1))
    #: SD3 time shift ``s`` of ``t' = s t / (1 + (s - 1) t)``; None = the model's own (1 for shapes)
    time_shift: float | None = field(default=None, metadata=_at_least(0.0, strict=True))
    guidance_scale: float = field(default=1.0, metadata=_at_least(1.0))
    #: the prompt CFG guides away from (the unconditional branch of every guided velocity: rollouts,
    #: GRPO's guided training, CRD's anchor); "" = the empty prompt. Diffusers backends only: the shapes
    #: models were trained to drop their prompt to "" alone.
    negative_prompt: str = ""


@dataclass
class AlgorithmConfig:
    """The RL algorithm and its settings (one flat section; each key says which algorithms read it).

    ``nft``: DiffusionNFT (:mod:`flowrl.algorithms.nft`); ``meanflow_nft``:
    MeanFlowNFT for MeanFlow models (:mod:`flowrl.algorithms.meanflow_nft`,
    the nft keys plus ``meanflow_*``); ``crd``: centered
    reward distillation (:mod:`flowrl.algorithms.crd`; it also reads the nft
    keys for its timesteps, adaptive weighting and old-model schedule);
    ``flow_grpo``: Flow-GRPO and ``branch_grpo``: BranchGRPO
    (:mod:`flowrl.algorithms.grpo`).
    """

    name: str = field(
        default="nft", metadata=_choice("nft", "crd", "meanflow_nft", "flow_grpo", "branch_grpo")
    )
    # --- all: group advantages
    advantage_clip: float = field(default=5.0, metadata=_at_least(0.0, strict=True))
    std_scope: str = field(default="batch", metadata=_choice("batch", "group"))
    # --- nft
    beta: float = field(default=1.0, metadata=_at_least(0.0, strict=True))
    timesteps: str = field(default="grid", metadata=_choice("grid", "sampled"))
    train_timesteps: int = field(default=4, metadata=_at_least(1))
    reference_weight: float = field(default=1e-4, metadata=_at_least(0.0))
    adaptive_weighting: bool = True
    old_update: str = field(default="soft", metadata=_choice("soft", "hard", "delayed"))
    #: soft/delayed schedules: ``eta = min(old_decay_start + old_decay_rate * steps, old_decay_max)``
    old_decay_start: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    old_decay_rate: float = field(default=0.001, metadata=_at_least(0.0))
    old_decay_max: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    old_update_every: int = field(default=10, metadata=_at_least(1))
    old_delay_steps: int = field(default=20, metadata=_at_least(0))
    # --- meanflow_nft: how d/dt u is taken and which interval [r, t] is trained
    meanflow_derivative: str = field(default="jvp", metadata=_choice("jvp", "central"))
    meanflow_interval: str = field(default="pairs", metadata=_choice("pairs", "grid", "equal", "uniform"))
    #: ``pairs``: shares of rows with r = t and with r = 0 (MeanFlow's own draws, DESIGN.md section 6)
    meanflow_equal_share: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    meanflow_zero_share: float = field(default=0.25, metadata={"min": 0.0, "max": 1.0})
    # --- crd: reward matching, the KL anchor to the CFG-guided base, and the decoupled sampler
    crd_loss: str = field(default="squared", metadata=_choice("squared", "logistic"))
    #: beta of ``beta * l_theta`` matched to the centred optimality probability
    crd_beta: float = field(default=1.0, metadata=_at_least(0.0, strict=True))
    anchor_weight: float = field(default=0.1, metadata=_at_least(0.0))
    #: the anchor's reference velocity is the base model's CFG mix at this guidance scale
    anchor_guidance: float = field(default=4.5, metadata=_at_least(1.0))
    #: reward-adaptive strength ``floor + (1 - floor) r`` per sample (r: optimality probability)
    anchor_adaptive: bool = True
    anchor_floor: float = field(default=0.001, metadata={"min": 0.0, "max": 1.0})
    #: the strength's schedule: factor 1 at step 0 moving linearly to ``anchor_schedule_end`` over
    #: ``anchor_schedule_steps`` steps (0 = constant)
    anchor_schedule_end: float = field(default=1.0, metadata=_at_least(0.0))
    anchor_schedule_steps: int = field(default=0, metadata=_at_least(0))
    #: the sampler: frozen (the base) for ``sampler_delay_steps``, then
    #: ``theta_s <- eta theta_s + (1 - eta) theta`` with ``eta = min(start + rate * (step - delay), max)``
    sampler_delay_steps: int = field(default=75, metadata=_at_least(0))
    sampler_decay_start: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    sampler_decay_rate: float = field(default=0.0075, metadata=_at_least(0.0))
    sampler_decay_max: float = field(default=0.999, metadata={"min": 0.0, "max": 1.0})
    # --- flow_grpo, branch_grpo: the SDE, the clipped ratio and the KL to the reference
    clip_range: float = field(default=1e-4, metadata=_at_least(0.0, strict=True))
    kl_weight: float = field(default=0.04, metadata=_at_least(0.0))
    noise_level: float = field(default=0.7, metadata=_at_least(0.0, strict=True))
    sde_variant: str = field(default="flow", metadata=_choice("flow", "cps"))
    #: steps ``[start, start + size)`` are stochastic (0 = all but the last); with ``sde_window_slide``
    #: the window moves ``sde_window_stride`` steps every ``sde_window_every`` iterations (MixGRPO)
    sde_window_size: int = field(default=0, metadata=_at_least(0))
    sde_window_start: int = field(default=0, metadata=_at_least(0))
    sde_window_slide: bool = False
    sde_window_stride: int = field(default=1, metadata=_at_least(1))
    sde_window_every: int = field(default=1, metadata=_at_least(1))
    # --- flow_grpo
    #: share of each sample's stochastic steps trained per iteration (a random subset per sample)
    timestep_fraction: float = field(default=1.0, metadata={"min": 0.0, "strict": True, "max": 1.0})
    #: train the CFG-guided velocity (sampler.guidance_scale) with the unconditional branch detached
    train_guidance: bool = False
    same_group_noise: bool = False
    drop_zero_std_groups: bool = False
    # --- branch_grpo: the tree, node rewards and pruning
    split_steps: list[int] = field(default_factory=lambda: [0, 2, 4])
    branching: int = field(default=2, metadata=_at_least(2))
    split_noise_level: float | None = None
    node_reward: str = field(default="mean", metadata=_choice("mean", "fusion"))
    #: depth pruning: train only edges into depths ``[depth_window_start, +size)`` (0 = all depths),
    #: sliding by one depth per iteration with ``depth_window_slide``
    depth_window_size: int = field(default=0, metadata=_at_least(0))
    depth_window_start: int = field(default=0, metadata=_at_least(0))
    depth_window_slide: bool = False
    #: width pruning: per tree and depth keep only the best and worst quarter of nodes by advantage
    width_pruning: bool = False


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
    seed: int = 0
    threads: int = field(default=0, metadata=_at_least(0))


@dataclass
class DataConfig:
    """Training prompts: ``shapes-train`` or ``video-shapes-train`` (the shipped splits of the shapes
    and moving-shapes worlds) or a ``.jsonl``/``.txt`` file.

    ``sampling``: "uniform" draws every prompt equally often; "balanced" gives
    every ``tag`` (task) the same share of draws, as a per-task average score
    such as GenEval's weighs them (the shapes train split is 74% colour
    attribution prompts and 1% single-object prompts).
    """

    prompts: str = "shapes-train"
    sampling: str = field(default="uniform", metadata=_choice("uniform", "balanced"))


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

    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    rewards: dict[str, Any] = field(default_factory=lambda: {"shapes_verifier": 1.0})
    reward_aggregation: str = field(default="sum", metadata=_choice("sum", "gdpo"))
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
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


class ConfigError(ValueError):
    """A config value that is not allowed; the message names the key, the value and what is allowed."""


# --- loading ------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Recursive merge: mappings merge key by key, anything else in ``update`` replaces."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key != "rewards":
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_yaml_with_defaults(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping of ``path`` merged over the files its ``defaults`` list names."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"config defaults form a cycle: {' -> '.join(str(p) for p in (*_seen, path))}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping, got {type(data).__name__}")
    defaults = data.pop("defaults", []) or []
    if isinstance(defaults, str):
        defaults = [defaults]
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
        node = data
        for key in keys[:-1]:
            node[key] = dict(node.get(key) or {})
            node = node[key]
        node[keys[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """A validated :class:`TrainConfig` from a YAML file (or the defaults) and overrides."""
    data = read_yaml_with_defaults(path) if path is not None else {}
    return build_config(apply_overrides(data, overrides or []))


def build_config(data: dict[str, Any]) -> TrainConfig:
    """Check a raw mapping against the schema and build the config (errors name the key)."""
    config = _build(TrainConfig, data, "")
    _check_cross_fields(config)
    return config


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
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
            values[name] = _build(kind, value, f"{key}.")
        else:
            values[name] = _check_value(key, value, kind, known[name].metadata)
    return cls(**values)


def _check_value(key: str, value: Any, kind: Any, rules: typing.Mapping[str, Any]) -> Any:
    value = _coerce(key, value, kind)
    if "choices" in rules and value not in rules["choices"]:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {list(rules['choices'])}")
    if "min" in rules:
        low, strict = rules["min"], rules.get("strict", False)
        if value < low or (strict and value == low):
            raise ConfigError(f"{key}={value!r} is not allowed; it must be {'>' if strict else '>='} {low}")
    if "max" in rules and value > rules["max"]:
        raise ConfigError(f"{key}={value!r} is not allowed; it must be <= {rules['max']}")
    return value


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
        return dict(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        try:  # YAML 1.1 reads "1e-4" (no dot) as a string
            return float(value)
        except ValueError:
            raise ConfigError(f"{key}={value!r} is not allowed; expected a number") from None
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r} is not allowed; expected true or false")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{key}={value!r} is not allowed; expected an integer")
    if not isinstance(value, kind):
        raise ConfigError(f"{key}={value!r} is not allowed; expected {kind.__name__}")
    return value


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
    implied = WORLD_OF_PROMPTS.get(prompts)
    if implied and config.evaluation.world not in (None, implied):
        raise ConfigError(
            f"evaluation.world={config.evaluation.world!r} does not match data.prompts={prompts!r} "
            f"(prompts of the {implied!r} world); set evaluation.world={implied} or leave it unset"
        )
    _check_model(config.model)
    if config.model.backend == "shapes" and config.sampler.negative_prompt:
        raise ConfigError(
            f"sampler.negative_prompt={config.sampler.negative_prompt!r} is not allowed for the shapes backend; "
            "its CFG guides against the empty prompt it was trained to drop to (allowed: '')"
        )
    if config.model.backend != "shapes" and (
        config.evaluation.guidance_scales or config.evaluation.base_guidance_scales
    ):
        raise ConfigError(
            f"evaluation.guidance_scales={config.evaluation.guidance_scales} and evaluation.base_guidance_scales="
            f"{config.evaluation.base_guidance_scales}: the held-out evaluation renders a shapes world and runs "
            f"on shapes models only; set both to [] for model.backend={config.model.backend!r}"
        )
    _check_grpo(config)
    _check_crd(config)
    shares = config.algorithm.meanflow_equal_share + config.algorithm.meanflow_zero_share
    if config.algorithm.meanflow_interval == "pairs" and shares > 1:
        raise ConfigError(
            f"algorithm.meanflow_equal_share={config.algorithm.meanflow_equal_share} + "
            f"algorithm.meanflow_zero_share={config.algorithm.meanflow_zero_share} = {shares:g} is not allowed; "
            "the two shares of rows must sum to at most 1"
        )
    if config.algorithm.timesteps == "grid" and config.algorithm.train_timesteps > config.sampler.num_steps:
        raise ConfigError(
            f"algorithm.train_timesteps={config.algorithm.train_timesteps} is more than the "
            f"{config.sampler.num_steps} steps of the rollout grid (sampler.num_steps); "
            "lower it or use algorithm.timesteps=sampled"
        )


def _check_model(model: ModelConfig) -> None:
    """Backend-specific model settings."""
    if model.backend == "shapes":
        if model.dtype != "float32":
            raise ConfigError(
                f"model.dtype={model.dtype!r} is not allowed for the shapes backend; it trains in float32 only"
            )
        return
    if model.name == "shapes-base":
        raise ConfigError(
            f"model.name='shapes-base' is not allowed for model.backend={model.backend!r}; give a diffusers "
            "pipeline id (e.g. stabilityai/stable-diffusion-3.5-medium) or directory"
        )
    if model.backend == "wan":
        from flowrl.models.wan import check_num_frames

        try:
            check_num_frames(model.num_frames)
        except ValueError as error:
            raise ConfigError(f"model.{error}") from error
    for key in ("height", "width"):
        if getattr(model, key) % 16:
            raise ConfigError(
                f"model.{key}={getattr(model, key)} is not allowed; it must be a multiple of 16 "
                "(VAE downsampling x latent packing)"
            )
    if model.attention_backend is not None:
        from diffusers.models.attention_dispatch import AttentionBackendName

        allowed = [backend.value for backend in AttentionBackendName]
        if model.attention_backend not in allowed:
            raise ConfigError(
                f"model.attention_backend={model.attention_backend!r} is not allowed; allowed: {allowed}"
            )


def _check_crd(config: TrainConfig) -> None:
    """CRD centres within prompt groups: a micro-batch must hold whole groups."""
    if config.algorithm.name == "crd" and config.training.micro_batch_size % config.training.group_size:
        raise ConfigError(
            f"training.micro_batch_size={config.training.micro_batch_size} is not allowed for crd; it must be a "
            f"multiple of training.group_size={config.training.group_size} (the loss centres within whole groups)"
        )


def _check_grpo(config: TrainConfig) -> None:
    """The SDE window, the tree shape and the group size agree with the sampler's step count."""
    algorithm, steps = config.algorithm, config.sampler.num_steps
    if algorithm.name not in ("flow_grpo", "branch_grpo"):
        return
    if steps < 2:
        raise ConfigError(f"sampler.num_steps={steps} is not allowed for {algorithm.name}; it needs >= 2")
    if algorithm.sde_window_size and (
        algorithm.sde_window_size > steps - 1
        or (
            not algorithm.sde_window_slide
            and algorithm.sde_window_start + algorithm.sde_window_size > steps - 1
        )
    ):
        raise ConfigError(
            f"algorithm.sde_window_start={algorithm.sde_window_start} + sde_window_size="
            f"{algorithm.sde_window_size} is not allowed; the window must lie in the first {steps - 1} steps "
            f"(sampler.num_steps={steps}; the last step is deterministic)"
        )
    if algorithm.name == "flow_grpo":
        if algorithm.same_group_noise and config.training.micro_batch_size % config.training.group_size:
            raise ConfigError(
                f"training.micro_batch_size={config.training.micro_batch_size} is not allowed with "
                f"algorithm.same_group_noise; it must be a multiple of group_size={config.training.group_size}"
            )
        return
    bad = [split for split in algorithm.split_steps if not 0 <= split < steps - 1]
    if bad or not algorithm.split_steps or len(set(algorithm.split_steps)) != len(algorithm.split_steps):
        raise ConfigError(
            f"algorithm.split_steps={algorithm.split_steps} is not allowed; give distinct steps in "
            f"[0, {steps - 2}] (sampler.num_steps={steps}; the last step is deterministic)"
        )
    leaves = algorithm.branching ** len(algorithm.split_steps)
    if config.training.group_size != leaves:
        raise ConfigError(
            f"training.group_size={config.training.group_size} is not allowed for branch_grpo; it must equal "
            f"branching ** len(split_steps) = {algorithm.branching} ** {len(algorithm.split_steps)} = {leaves} "
            "(the leaves of one tree)"
        )
    if config.training.micro_batch_size % leaves:
        raise ConfigError(
            f"training.micro_batch_size={config.training.micro_batch_size} is not allowed for branch_grpo; "
            f"it must be a multiple of the {leaves} leaves of a tree (rollouts are whole trees)"
        )
    if algorithm.depth_window_size and algorithm.depth_window_size > steps - 1:
        raise ConfigError(
            f"algorithm.depth_window_size={algorithm.depth_window_size} is not allowed; at most {steps - 1} "
            f"(the stochastic depths of sampler.num_steps={steps})"
        )
