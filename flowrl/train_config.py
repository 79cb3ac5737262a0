"""The run's config schema: the shared sections and :class:`TrainConfig`, with every field's rule and help.

A leaf module: it imports no registry (algorithms, backends) and nothing that imports this module back,
so that algorithm and backend modules can name :class:`TrainConfig` in their hooks without an import
circle. The ``model`` and ``algorithm`` sections are the chosen backend's and algorithm's own dataclasses
(registered in :mod:`flowrl.models` and :mod:`flowrl.algorithms`); :func:`flowrl.config.build_config`
fills them. Loading (YAML, ``defaults``, overrides) and the checks that need the registries or other
files are :mod:`flowrl.config`'s.

A field's help text is the ``#:`` comment above it (:mod:`flowrl.config_help`; ``flowrl config`` prints
it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from flowrl.config_schema import ConfigError
from flowrl.config_schema import at_least as _at_least
from flowrl.config_schema import choice as _choice
from flowrl.learning_rate import LR_SCHEDULES
from flowrl.precision import MIXED_PRECISIONS

__all__ = [
    "AlgorithmConfig",
    "DataConfig",
    "EvaluationConfig",
    "LoggingConfig",
    "SamplerConfig",
    "TrainConfig",
    "TrainingConfig",
    "WORLD_OF_PROMPTS",
]


@dataclass
class AlgorithmConfig:
    """The keys every algorithm has (the ``algorithm`` section); each algorithm's config adds its own.

    ``name`` picks the algorithm (and with it the config class) from the
    registry of :mod:`flowrl.algorithms`; a key the chosen algorithm does not
    have is a config error.
    """

    #: the algorithm (a name registered in flowrl.algorithms): nft, meanflow_nft, crd, flow_grpo,
    #: branch_grpo, raft
    name: str = "nft"
    #: advantages are clipped to ``[-advantage_clip, advantage_clip]``
    advantage_clip: float = field(default=5.0, metadata=_at_least(0.0, strict=True))
    #: group advantages ``(R - mean_group R) / (std + eps)`` take the std over the whole batch or per group
    std_scope: str = field(default="batch", metadata=_choice("batch", "group"))

    def check(self, config: TrainConfig) -> None:
        """Rules that involve other sections (sampler steps, group sizes); raise ``ConfigError``."""


@dataclass
class SamplerConfig:
    """Rollouts: an ODE solver of ``samplers`` on a (shifted) time grid, CFG-free by default."""

    #: the ODE solver of the rollouts (the samplers package): euler, heun (2 evaluations a step) or dpm2m;
    #: the GRPO family replaces it with its SDE
    solver: str = field(default="euler", metadata=_choice("euler", "heun", "dpm2m"))
    #: steps of the rollout time grid (the GRPO family's SDE steps, NFT's grid of training times)
    num_steps: int = field(default=10, metadata=_at_least(1))
    #: SD3 time shift ``s`` of ``t' = s t / (1 + (s - 1) t)`` on ``linspace(1, 0, S + 1)``; None = the model's own
    #: default grid (a diffusers model's: exactly its scheduler's sigmas for S steps; shapes: unshifted)
    time_shift: float | None = field(default=None, metadata=_at_least(0.0, strict=True))
    #: classifier-free guidance of the rollouts: 1 = none (the CFG-free policy the NFT family trains)
    guidance_scale: float = field(default=1.0, metadata=_at_least(1.0))
    #: the prompt CFG guides away from (the unconditional branch of every guided velocity: rollouts,
    #: GRPO's guided training, CRD's anchor); "" = the empty prompt. Diffusers backends only: the shapes
    #: models were trained to drop their prompt to "" alone.
    negative_prompt: str = ""


@dataclass
class TrainingConfig:
    """Global batch sizes and optimisation. Images per step = ``prompts_per_step * group_size``."""

    #: training steps: each samples prompts_per_step x group_size images and makes updates_per_step
    #: optimizer updates
    steps: int = field(default=100, metadata=_at_least(1))
    #: distinct prompts per step (global, over all processes)
    prompts_per_step: int = field(default=8, metadata=_at_least(1))
    #: samples per prompt: a group, whose rewards are normalised together into advantages
    group_size: int = field(default=8, metadata=_at_least(2))
    #: images per forward and backward on one process (gradient accumulation over the rest; rollouts use
    #: the same size)
    micro_batch_size: int = field(default=32, metadata=_at_least(1))
    #: optimizer updates per rollout batch; each takes the same share of every process's (timestep x
    #: micro-batch) units, so with more than one the samples that share an update depend on the number
    #: of processes (same data and sizes, not bit-identical across process counts)
    updates_per_step: int = field(default=1, metadata=_at_least(1))
    #: peak learning rate of AdamW (after warm-up)
    learning_rate: float = field(default=3e-4, metadata=_at_least(0.0, strict=True))
    #: optimizer steps of linear warm-up
    warmup_steps: int = field(default=0, metadata=_at_least(0))
    #: after warm-up: "constant", or "cosine" decay to ``min_learning_rate_ratio`` of the peak at the last
    #: optimizer step (``steps * updates_per_step``)
    lr_schedule: str = field(default="constant", metadata=_choice(*LR_SCHEDULES))
    #: the cosine schedule's final learning rate as a share of the peak
    min_learning_rate_ratio: float = field(default=0.1, metadata={"min": 0.0, "max": 1.0})
    #: AdamW's decoupled weight decay
    weight_decay: float = field(default=0.0, metadata=_at_least(0.0))
    #: AdamW's beta2 (beta1 is 0.9); 0.999 as torch's default, lower (e.g. 0.95) adapts faster to the
    #: changing RL loss
    adam_beta2: float = field(default=0.999, metadata={"min": 0.0, "max": 1.0})
    #: the gradient's global norm is clipped to this before every optimizer update
    grad_clip: float = field(default=1.0, metadata=_at_least(0.0, strict=True))
    #: decay of an exponential moving average of the trained weights, saved and evaluated as the tuned
    #: model (0 = none)
    ema_decay: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    #: seed of everything random in the run (prompts, noise, training draws), per step and sample, so runs
    #: on 1 or N processes see the same data
    seed: int = field(default=0, metadata=_at_least(0))
    #: torch's CPU threads (0 = torch's default); 1 for each of two processes on a 2-core machine
    threads: int = field(default=0, metadata=_at_least(0))
    #: "bf16": every velocity of the policy (rollouts, training, reference, evaluation) under
    #: ``torch.autocast`` in bfloat16, its output cast back to float32; weights, optimizer state,
    #: log-probabilities and losses stay float32. "no": float32 throughout. "auto": bf16 for the shapes
    #: models on a CPU with bfloat16 matrix instructions (AVX-512 BF16, AMX), "no" elsewhere; the run says
    #: which at start and records it in its config.yaml
    mixed_precision: str = field(default="auto", metadata=_choice(*MIXED_PRECISIONS))
    #: steps in a row whose update may be skipped (non-finite loss or gradients, or a reward batch an
    #: ``on_error: skip_batch`` reward failed) before the run stops with an error
    max_consecutive_skips: int = field(default=5, metadata=_at_least(1))


@dataclass
class DataConfig:
    """Training prompts and how each step draws them ("balanced" weighs every task as a per-task average
    score such as GenEval's does)."""

    #: training prompts: shapes-train, video-shapes-train (the shipped splits) or a .jsonl (records with
    #: prompt, tag, ...) / .txt (one prompt a line) file
    prompts: str = "shapes-train"
    #: uniform: every prompt equally often; balanced: every task (tag) the same share of draws (the shapes
    #: train split is 74% colour attribution)
    sampling: str = field(default="uniform", metadata=_choice("uniform", "balanced"))
    #: with balanced sampling: relative share per tag (1 for a tag not named), e.g. {single_object: 0.5}
    task_weights: dict[str, float] = field(default_factory=dict)


@dataclass
class LoggingConfig:
    """Where the run goes and how often it reports."""

    #: the run's folder: config.yaml, metrics.jsonl, curves.png, samples/, eval/, checkpoints/, model/,
    #: summary.json
    output_dir: str = "runs/shapes_nft"
    #: also log to tensorboard or wandb (through Accelerate); none = the run folder only
    tracker: str = field(default="none", metadata=_choice("none", "tensorboard", "wandb"))
    #: every this many steps, a grid of training samples in samples/ (0 = never)
    sample_every: int = field(default=10, metadata=_at_least(0))
    #: every this many steps, a checkpoint to resume from (0 = only at the end)
    checkpoint_every: int = field(default=10, metadata=_at_least(0))
    #: checkpoints kept; older ones are deleted once a newer one is verified
    keep_checkpoints: int = field(default=2, metadata=_at_least(1))
    #: progress bars on the terminal
    progress: bool = True


@dataclass
class EvaluationConfig:
    """Held-out GenEval-style evaluation (shapes models): before training, every ``every`` steps, at the end."""

    #: whose held-out prompts and verifier judge the model: shapes (images), video_shapes (clips) or
    #: video_shapes_i2v (clips continued from a given first frame); None = the world of data.prompts
    world: str | None = field(
        default=None, metadata=_choice(None, "shapes", "video_shapes", "video_shapes_i2v")
    )

    #: evaluate the tuned model every this many steps (0 = only before and after training)
    every: int = field(default=0, metadata=_at_least(0))
    #: held-out images per task (GenEval-style score = the mean over tasks)
    images_per_task: int = field(default=64, metadata=_at_least(1))
    #: Euler steps of the evaluation's sampling
    num_steps: int = field(default=20, metadata=_at_least(1))
    #: CFG scales the tuned model is evaluated at, at the end (1 = none)
    guidance_scales: list[float] = field(default_factory=lambda: [1.0])
    #: CFG scales the base model is evaluated at, before training
    base_guidance_scales: list[float] = field(default_factory=lambda: [1.0, 3.0])


@dataclass(kw_only=True)
class TrainConfig:
    """A whole training run (built by :func:`flowrl.config.build_config`, which chooses ``model`` and
    ``algorithm``'s dataclasses by ``model.backend`` and ``algorithm.name``)."""

    #: the backend's own config dataclass (:mod:`flowrl.models`), chosen by ``model.backend``
    model: Any
    #: how rollouts sample
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    #: reward name -> weight, or -> {weight, settings, key, on_error, timeout} (see docs/rewards.md); the
    #: total is their weighted sum
    rewards: dict[str, Any] = field(default_factory=lambda: {"shapes_verifier": 1.0})
    #: sum: advantages of the weighted total; gdpo: each reward normalised in its group first, then summed
    #: (GDPO)
    reward_aggregation: str = field(default="sum", metadata=_choice("sum", "gdpo"))
    #: the algorithm's own config dataclass (:mod:`flowrl.algorithms`), chosen by ``algorithm.name``
    algorithm: AlgorithmConfig
    #: batch sizes, steps and optimisation
    training: TrainingConfig = field(default_factory=TrainingConfig)
    #: training prompts and how they are drawn
    data: DataConfig = field(default_factory=DataConfig)
    #: where the run goes and how often it reports
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    #: held-out evaluation
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    #: continue a run: latest (its newest verified checkpoint) or a checkpoint folder; only run length and
    #: reporting may change
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
WORLD_OF_PROMPTS: dict[str, str] = {
    "shapes-train": "shapes",
    "video-shapes-train": "video_shapes",
    "video-shapes-i2v-train": "video_shapes_i2v",
}
