"""The ``algorithm`` section of FPO (``name: fpo``): the Monte-Carlo draws of the ratio, the PPO clip and the
epochs over each rollout batch."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.algorithms.forward_process_config import ForwardProcessConfig
from flowrl.config_schema import at_least, choice


@dataclass
class FPOConfig(ForwardProcessConfig):
    """FPO (:mod:`flowrl.algorithms.fpo`): ``train_timesteps`` is the number of Monte-Carlo draws
    ``(t, eps)`` per sample that estimate each ratio (the reference's ``n_samples_per_action``, 8), drawn
    ``U(0, 1)`` with ``timesteps: sampled`` (the reference's default) or among the rollout grid's times."""

    name: str = "fpo"
    #: eps of the PPO clip ``clip(rho, 1 - eps, 1 + eps)`` (the reference's ``clipping_epsilon``: 0.05)
    clip_range: float = field(default=0.05, metadata=at_least(0.0, strict=True))
    #: ``sample``: one ratio per sample from the draws' mean losses (the reference's default,
    #: ``average_losses_before_exp``); ``draw``: one ratio per draw, its log clipped to +-3 before ``exp``
    ratio: str = field(default="sample", metadata=choice("sample", "draw"))
    #: passes over each rollout batch with the same draws, each a PPO epoch (the reference's
    #: ``num_updates_per_batch``); ``training.updates_per_step`` splits them into optimizer updates
    epochs: int = field(default=1, metadata=at_least(1))
    #: lambda of the pull ``lambda ||v_theta - v_ref||²`` towards the frozen base (0: FPO as published)
    reference_weight: float = field(default=0.0, metadata=at_least(0.0))
