"""The ``algorithm`` section of CRD (``name: crd``): DiffusionNFT's keys (timesteps, adaptive weighting,
the old model's schedule) plus the reward matching, the KL anchor and the decoupled rollout copy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.nft_config import NFTConfig
from flowrl.config_schema import ConfigError, at_least, choice

if TYPE_CHECKING:
    from flowrl.train_config import TrainConfig


@dataclass
class CRDConfig(NFTConfig):
    """CRD (:mod:`flowrl.algorithms.crd`)."""

    name: str = "crd"
    #: squared: (c / beta) (beta l_c - r_c)^2 (the paper); logistic: (c / beta) BCE(beta l_c, sigmoid(r_c))
    #: (the reference's soft target)
    crd_loss: str = field(default="squared", metadata=choice("squared", "logistic"))
    #: the errors of the implicit log-ratio: ``velocity`` (against ``eps - x0``, the reference code) or ``x0``
    #: space (the same times ``t``, flowrl's earlier form, DiffusionNFT's space)
    crd_error_space: str = field(default="velocity", metadata=choice("velocity", "x0"))
    #: match the log-ratio centred within its group (the paper and the reference) or uncentred (flowrl's
    #: variant: the centred loss plus a restoring force on the group's mean log-ratio; module docstring)
    center_log_ratio: bool = True
    #: beta of ``beta * l_theta`` matched to the centred optimality probability
    crd_beta: float = field(default=1.0, metadata=at_least(0.0, strict=True))
    #: weight of the anchor term pulling theta towards the CFG-guided base velocity (0 = no anchor)
    anchor_weight: float = field(default=0.1, metadata=at_least(0.0))
    #: the anchor's reference velocity is the base model's CFG mix at this guidance scale
    anchor_guidance: float = field(default=4.5, metadata=at_least(1.0))
    #: the anchor's strength factor ``floor + (1 - floor) a``: ``a`` the per-sample ``optimality`` probability
    #: (the reference code's reward-adaptive KL), the step's ``reward_level`` (the raw mean reward mapped by
    #: ``anchor_reward_range`` to [0, 1]: flowrl's reading of the paper's text), or ``none``
    anchor_adaptive: str = field(default="optimality", metadata=choice("optimality", "reward_level", "none"))
    #: the anchor's strength never falls below this share of anchor_weight
    anchor_floor: float = field(default=0.001, metadata={"min": 0.0, "max": 1.0})
    #: raw total rewards ``[low, high]`` that map to reward levels 0 and 1
    anchor_reward_range: list[float] = field(default_factory=lambda: [0.0, 1.0])
    #: the strength's schedule: factor 1 at step 0 moving linearly to ``anchor_schedule_end`` over
    #: ``anchor_schedule_steps`` steps (0 = constant)
    anchor_schedule_end: float = field(default=1.0, metadata=at_least(0.0))
    #: steps over which the strength factor moves from 1 to anchor_schedule_end (0 = constant)
    anchor_schedule_steps: int = field(default=0, metadata=at_least(0))
    #: the rollout copy: a copy of theta (or, with ``hold``, the base) for ``rollout_delay_steps`` counts, then
    #: ``theta_r <- eta theta_r + (1 - eta) theta`` with ``eta = min(start + rate * (n - delay), max)``; ``n``
    #: counts what ``old_decay_counter`` says (optimizer updates by default, as the reference)
    rollout_delay_steps: int = field(default=75, metadata=at_least(0))
    #: the rollout copy's eta at the end of the delay
    rollout_decay_start: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    #: the rollout copy's eta growth per count after the delay
    rollout_decay_rate: float = field(default=0.0075, metadata=at_least(0.0))
    #: the rollout copy's eta ceiling (0.999: the copy all but freezes)
    rollout_decay_max: float = field(default=0.999, metadata={"min": 0.0, "max": 1.0})
    #: during the delay the rollout copy is a ``copy`` of theta every step (the reference's
    #: ``sampling_model_decay``, DiffusionNFT's decay_type 2, whose numbers these defaults are) or ``hold``s
    #: the base (flowrl's earlier variant)
    rollout_first_phase: str = field(default="copy", metadata=choice("copy", "hold"))

    def check(self, config: TrainConfig) -> None:
        super().check(config)
        low_high = self.anchor_reward_range
        if len(low_high) != 2 or not low_high[0] < low_high[1]:
            raise ConfigError(
                f"algorithm.anchor_reward_range={low_high} is not allowed; give [low, high] with low < high"
            )
        if config.training.micro_batch_size % config.training.group_size:
            raise ConfigError(
                f"training.micro_batch_size={config.training.micro_batch_size} is not allowed for crd; it must "
                f"be a multiple of training.group_size={config.training.group_size} (the loss centres within "
                "whole groups)"
            )
