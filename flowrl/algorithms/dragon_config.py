"""The ``algorithm`` section of DRAGON (``name: dragon``): how the positive and negative sets are built from
each group and the DPO temperature of their contrast."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.forward_process_config import ForwardProcessConfig
from flowrl.config_schema import ConfigError, at_least, choice

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class DRAGONConfig(ForwardProcessConfig):
    """DRAGON (:mod:`flowrl.algorithms.dragon`): each group's ``pairs_per_group`` best samples form the
    positive set and as many worst the negative set, paired best with worst; every pair trained at
    ``train_timesteps`` times ``t ~ U(0, 1)`` with one noise shared by both images."""

    name: str = "dragon"
    timesteps: str = field(default="sampled", metadata=choice("grid", "sampled"))
    train_timesteps: int = field(default=1, metadata=at_least(1))
    #: positive (and negative) samples taken from each group: its best ``k`` and its worst ``k``
    pairs_per_group: int = field(default=1, metadata=at_least(1))
    #: beta of Diffusion-DPO's ``-log sigmoid(-beta (D_w - D_l))`` on pixel-mean squared velocity errors
    beta: float = field(default=2500.0, metadata=at_least(0.0, strict=True))
    #: the DPO reference: the frozen ``base`` (Diffusion-DPO's) or the rollout copy, the policy that sampled
    #: the step (``rollout``: an on-policy contrast, as in online DPO)
    reference: str = field(default="base", metadata=choice("base", "rollout"))

    def check(self, config: TrainConfig) -> None:
        super().check(config)
        if 2 * self.pairs_per_group > config.training.group_size:
            raise ConfigError(
                f"algorithm.pairs_per_group={self.pairs_per_group} is not allowed: the positive and negative "
                f"sets of a group of training.group_size={config.training.group_size} must not overlap "
                f"(at most {config.training.group_size // 2})"
            )
