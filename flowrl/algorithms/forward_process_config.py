"""The training-time keys of the forward-process algorithms (DiffusionNFT and its variants, RAFT;
:mod:`flowrl.algorithms.forward_process`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.config_schema import ConfigError, at_least, choice
from flowrl.train_config import AlgorithmConfig

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class ForwardProcessConfig(AlgorithmConfig):
    """The training times of the algorithms that train on clean samples (DiffusionNFT and its variants,
    RAFT; :class:`flowrl.algorithms.forward_process.ForwardProcessAlgorithm`)."""

    #: training times: distinct times of the rollout grid per sample (``grid``) or ``U(0, 1)`` (``sampled``)
    timesteps: str = field(default="grid", metadata=choice("grid", "sampled"))
    #: training times (loss passes) per sample and step
    train_timesteps: int = field(default=4, metadata=at_least(1))
    #: no training time below this (0: all); a fit to the model's own samples at low noise teaches their
    #: pixel-level flaws (RAFT on the shapes world)
    min_train_time: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})

    def check(self, config: TrainConfig) -> None:
        if self.timesteps == "grid" and self.train_timesteps > config.sampler.num_steps:
            raise ConfigError(
                f"algorithm.train_timesteps={self.train_timesteps} is more than the "
                f"{config.sampler.num_steps} steps of the rollout grid (sampler.num_steps); "
                "lower it or use algorithm.timesteps=sampled"
            )
