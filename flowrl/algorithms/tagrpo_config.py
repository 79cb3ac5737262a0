"""The ``algorithm`` section of TAGRPO (``name: tagrpo``): Flow-GRPO's keys plus the weight of the trajectory
alignment term, the memory bank and the per-prompt initial noise."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.grpo_config import FlowGRPOConfig
from flowrl.config_schema import ConfigError, at_least

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class TAGRPOConfig(FlowGRPOConfig):
    """TAGRPO (:mod:`flowrl.algorithms.tagrpo`) on Flow-GRPO's SDE, clip, KL and trained steps; ``clip_range``
    clips the alignment ratios too (the paper's one ``epsilon``)."""

    name: str = "tagrpo"
    #: the rollouts of a group share their initial noise (the method's premise; required)
    same_group_noise: bool = True
    #: gamma of ``J = J_GRPO + gamma J_align`` (the paper: 1)
    align_weight: float = field(default=1.0, metadata=at_least(0.0))
    #: trajectories kept per prompt in the memory bank (the best and the worst of every group, first in,
    #: first out; 0: no bank, the anchors are the group's own best and worst)
    memory_bank_size: int = field(default=0, metadata=at_least(0))
    #: every rollout of a prompt starts from the same noise, seeded by the prompt and ``training.seed``
    #: (the SDE noise still differs), so that the bank's trajectories of a prompt share it with new groups
    prompt_noise: bool = False

    def check(self, config: TrainConfig) -> None:
        if not self.same_group_noise:
            raise ConfigError(
                "algorithm.same_group_noise=false is not allowed for tagrpo; its groups share their initial "
                "noise (the alignment compares trajectories that start from the same point)"
            )
        if self.memory_bank_size and not self.prompt_noise:
            raise ConfigError(
                f"algorithm.memory_bank_size={self.memory_bank_size} is not allowed with prompt_noise=false; "
                "the bank's trajectories of a prompt must start from the noise its new groups start from"
            )
        if config.reward_aggregation != "sum":
            raise ConfigError(
                f"reward_aggregation={config.reward_aggregation!r} is not allowed for tagrpo; it ranks "
                "trajectories by their total reward (allowed: 'sum')"
            )
        super().check(config)
