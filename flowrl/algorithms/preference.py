"""Diffusion-DPO on flow-matching errors, what SePPO and DRAGON share.

For a pair (winner ``x^w``, loser ``x^l``) of one prompt, one time ``t`` and one noise ``eps`` shared by both,
``x_t = (1 - t) x + t eps`` and the pixel-mean squared velocity errors
``e_m(x) = ||v_m(x_t, t, c) - (eps - x)||²`` of the trained model ``theta`` and a reference ``ref``::

    D_w = e_theta(x^w) - e_ref(x^w),   D_l = e_theta(x^l) - e_ref(x^l)
    L   = -log sigmoid( -beta (D_w - sign D_l) )

(Wallace et al.'s Diffusion-DPO with ``beta`` for their ``beta T omega(lambda_t)``; ``sign = +1`` is DPO,
SePPO's flipper sets ``-1`` per pair). ``D_w - D_l < 0`` means theta prefers the winner more than ``ref`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from flowrl.algorithms.forward_process import pixel_mean
from samplers import VelocityFn, select_rows

if TYPE_CHECKING:
    from flowrl.policy import Policy


def pair_errors(
    policy: Policy,
    reference: VelocityFn,
    winners: torch.Tensor,
    losers: torch.Tensor,
    t: torch.Tensor,
    noise: torch.Tensor,
    cond: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[2, B]`` errors of the trained model (with gradients) and of ``reference`` (row 0: winners, row 1:
    losers), every image of the micro-batch in one forward of each."""
    rows = winners.shape[0]
    column = t.reshape(-1, *([1] * (winners.ndim - 1))).to(winners.dtype)
    x_t = torch.cat([(1 - column) * winners + column * noise, (1 - column) * losers + column * noise])
    targets = torch.cat([noise - winners, noise - losers]).float()
    times, both = t.repeat(2), select_rows(cond, torch.arange(rows).repeat(2))
    errors = pixel_mean((policy.velocity(x_t, times, both).float() - targets) ** 2).unflatten(0, (2, rows))
    with torch.no_grad():
        reference_errors = pixel_mean((reference(x_t, times, both).float() - targets) ** 2).unflatten(
            0, (2, rows)
        )
    return errors, reference_errors


def dpo_losses(
    errors: torch.Tensor, reference_errors: torch.Tensor, beta: float, sign: torch.Tensor | float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair ``L`` of the module docstring and the margin ``D_w - sign D_l`` from ``[2, B]`` errors."""
    differences = errors - reference_errors
    margin = differences[0] - sign * differences[1]
    return -F.logsigmoid(-beta * margin), margin
