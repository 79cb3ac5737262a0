"""The ``algorithm`` section of DiffusionNFT (``name: nft``); MeanFlowNFT and CRD extend it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from flowrl.algorithms.forward_process_config import ForwardProcessConfig
from flowrl.config_schema import at_least, choice

if TYPE_CHECKING:
    pass


@dataclass
class NFTConfig(ForwardProcessConfig):
    """DiffusionNFT (:mod:`flowrl.algorithms.nft`): the implicit policies' strength, the training times,
    the reference pull and the old policy's schedule."""

    name: str = "nft"
    #: beta of ``v+ = beta v_theta + (1 - beta) v_old`` and ``v- = (1 + beta) v_old - beta v_theta``
    beta: float = field(default=1.0, metadata=at_least(0.0, strict=True))
    #: lambda of the pull ``lambda ||v_theta - v_ref||²`` towards the frozen base
    reference_weight: float = field(default=1e-4, metadata=at_least(0.0))
    #: divide each x0-space error by its own detached mean absolute error (the reference's weighting)
    adaptive_weighting: bool = True
    #: the old policy's update: ``soft`` (decay schedule), ``hard`` (a copy every ``old_update_every`` steps),
    #: ``delayed`` (none for ``old_delay_steps`` steps, then soft)
    old_update: str = field(default="soft", metadata=choice("soft", "hard", "delayed"))
    #: soft/delayed schedules: ``eta = min(old_decay_start + old_decay_rate * n, old_decay_max)``
    old_decay_start: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    #: soft/delayed: eta's growth per count n
    old_decay_rate: float = field(default=0.001, metadata=at_least(0.0))
    #: soft/delayed: eta's ceiling (1 freezes the old policy once reached)
    old_decay_max: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    #: soft: the old policy is a plain copy (eta = 0) for the first ``old_flat_steps`` counts, then the ramp
    #: starts from there (the reference's decay_type 2 uses 75 with rate 0.0075 and max 0.999)
    old_flat_steps: int = field(default=0, metadata=at_least(0))
    #: what ``n`` counts: optimizer ``updates`` (the reference's global_step) or training ``steps``
    old_decay_counter: str = field(default="updates", metadata=choice("updates", "steps"))
    #: hard: steps between copies of theta into the old policy
    old_update_every: int = field(default=10, metadata=at_least(1))
    #: delayed: steps with no old-policy update before the soft schedule starts
    old_delay_steps: int = field(default=20, metadata=at_least(0))
