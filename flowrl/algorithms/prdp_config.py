"""The ``algorithm`` section of PRDP (``name: prdp``): the KL strength ``beta``, the per-step proximal clip,
the epochs over each rollout batch and which reward differences count as pairs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.grpo_config import FlatGRPOConfig
from flowrl.config_schema import ConfigError, at_least

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class PRDPConfig(FlatGRPOConfig):
    """PRDP (:mod:`flowrl.algorithms.prdp`) on the Flow-SDE of the GRPO algorithms (its noise level, variant
    and window); ``clip_range`` is the per-step clip ``eps`` of the implicit reward around the old policy's
    (the paper's large-scale 1e-4) and ``kl_weight`` an optional KL to the reference on the step means (0: the
    paper, whose only regulariser is ``beta``)."""

    name: str = "prdp"
    kl_weight: float = field(default=0.0, metadata=at_least(0.0))
    #: beta of the KL-regularised objective: the target of a pair is ``(r_a - r_b) / beta`` (the paper: 3e-5
    #: for 45 prompts, 3e-6 at scale)
    beta: float = field(default=3e-5, metadata=at_least(0.0, strict=True))
    #: passes over each rollout batch (the paper's K gradient steps per epoch: 10 small-scale, 1 at scale;
    #: the clip can only hold from the second); ``training.updates_per_step`` splits them into updates
    epochs: int = field(default=2, metadata=at_least(1))
    #: pairs whose rewards differ by at most this are left out (0: ties, as the reference code's mask)
    tie_threshold: float = field(default=0.0, metadata=at_least(0.0))

    def check(self, config: TrainConfig) -> None:
        """Every micro-batch holds whole prompt groups: the pairs are formed inside a group."""
        if config.training.micro_batch_size % config.training.group_size:
            raise ConfigError(
                f"training.micro_batch_size={config.training.micro_batch_size} is not allowed for prdp; it must "
                f"be a multiple of training.group_size={config.training.group_size} (pairs are formed in a group)"
            )
        super().check(config)
