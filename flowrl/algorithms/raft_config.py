"""The ``algorithm`` section of RAFT (``name: raft``): how many samples of each group it keeps and at which
times it trains on them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.forward_process_config import ForwardProcessConfig
from flowrl.config_schema import ConfigError, at_least

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class RAFTConfig(ForwardProcessConfig):
    """RAFT (:mod:`flowrl.algorithms.raft`): the baseline that fine-tunes on each group's best samples, at
    ``train_timesteps`` training times per kept sample."""

    name: str = "raft"
    #: samples kept per group: the ``keep_per_group`` highest total rewards (ties: the earlier sample)
    keep_per_group: int = field(default=1, metadata=at_least(1))
    train_timesteps: int = field(default=2, metadata=at_least(1))
    #: weigh each sample's error as DiffusionNFT's positive term does (x0-space, divided by its own detached
    #: mean absolute error) instead of the plain velocity-space flow-matching loss
    adaptive_weighting: bool = False
    #: lambda of the pull ``lambda ||v_theta - v_ref||²`` towards the frozen base (0: plain RAFT)
    reference_weight: float = field(default=0.0, metadata=at_least(0.0))
    #: the pull's reference velocity is the base's CFG mix ``v_u + w (v_c - v_u)`` at this guidance scale
    #: (1: the unguided base; above 1 the trained model is pulled toward the guided base's velocity)
    reference_guidance: float = field(default=1.0, metadata=at_least(1.0))
    #: a kept sample whose total reward is below this is not fitted (weight 0; the loss averages over the
    #: global batch's fitted samples): the best of a group where every sample is wrong is not imitated
    #: (None: every kept sample is fitted, plain RAFT)
    min_reward: float | None = None

    def check(self, config: TrainConfig) -> None:
        super().check(config)
        group_size = config.training.group_size
        if self.keep_per_group >= group_size:
            raise ConfigError(
                f"algorithm.keep_per_group={self.keep_per_group} is not allowed; it must be below "
                f"training.group_size={group_size} (keeping the whole group selects nothing)"
            )
