"""The ``algorithm`` section of SePPO (``name: seppo``): the DPO temperature, the pool of earlier checkpoints
and how the reference is chosen from it, and the anchor-based flipper."""

from __future__ import annotations

from dataclasses import dataclass, field

from flowrl.algorithms.forward_process_config import ForwardProcessConfig
from flowrl.config_schema import at_least, choice


@dataclass
class SePPOConfig(ForwardProcessConfig):
    """SePPO (:mod:`flowrl.algorithms.seppo`): each sample is a pair, the prompt's rendered scene (the
    winner) and the reference checkpoint's sample (the reference sample), trained at ``train_timesteps``
    times ``t`` (with one noise shared by both images), drawn ``U(0, 1)`` as Diffusion-DPO does."""

    name: str = "seppo"
    timesteps: str = field(default="sampled", metadata=choice("grid", "sampled"))
    train_timesteps: int = field(default=1, metadata=at_least(1))
    #: beta of ``-log sigmoid(-beta (D_w - sign D_ref))`` on pixel-mean squared velocity errors
    #: (Diffusion-DPO's ``beta_dpo`` 5000 times its factor 1/2 on SD1.5: 2500)
    beta: float = field(default=2500.0, metadata=at_least(0.0, strict=True))
    #: training steps between the checkpoints added to the pool (the paper: every 30 updates)
    pool_every: int = field(default=30, metadata=at_least(1))
    #: checkpoints the pool keeps, the base included (the paper's K = 7); beyond it the oldest one after the
    #: base is dropped
    pool_size: int = field(default=7, metadata=at_least(1))
    #: which pool checkpoint samples and serves as the DPO reference each step: ``random`` (uniform over the
    #: pool, the paper's ``ref ~ U(0, k - 1)``), ``latest`` (SPIN-Diffusion's) or ``initial`` (the base:
    #: Diffusion-DPO with generated losers)
    reference: str = field(default="random", metadata=choice("random", "latest", "initial"))
    #: the anchor-based adaptive flipper: a reference sample counts as a winner when the reference fits the
    #: rendered winner better than the trained model does (false: every reference sample is a loser)
    flipper: bool = True
