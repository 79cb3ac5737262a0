"""The ``algorithm`` section of RAFT (``name: raft``): how many samples of each group it keeps and at which
times it trains on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.base import AlgorithmConfig
from flowrl.config_schema import ConfigError, at_least, choice

if TYPE_CHECKING:
    from flowrl.config import TrainConfig


@dataclass
class RAFTConfig(AlgorithmConfig):
    """RAFT (:mod:`flowrl.algorithms.raft`): the baseline that fine-tunes on each group's best samples."""

    name: str = "raft"
    #: samples kept per group: the ``keep_per_group`` highest total rewards (ties: the earlier sample)
    keep_per_group: int = field(default=1, metadata=at_least(1))
    #: training times: distinct times of the rollout grid per kept sample (``grid``) or ``U(0, 1)``
    timesteps: str = field(default="grid", metadata=choice("grid", "sampled"))
    #: training times (loss passes) per kept sample and step
    train_timesteps: int = field(default=2, metadata=at_least(1))

    def check(self, config: TrainConfig) -> None:
        group_size = config.training.group_size
        if self.keep_per_group >= group_size:
            raise ConfigError(
                f"algorithm.keep_per_group={self.keep_per_group} is not allowed; it must be below "
                f"training.group_size={group_size} (keeping the whole group selects nothing)"
            )
        if self.timesteps == "grid" and self.train_timesteps > config.sampler.num_steps:
            raise ConfigError(
                f"algorithm.train_timesteps={self.train_timesteps} is more than the "
                f"{config.sampler.num_steps} steps of the rollout grid (sampler.num_steps); "
                "lower it or use algorithm.timesteps=sampled"
            )
