"""Samplers: integrate a velocity field ``v(x, t, cond)`` from noise (t = 1) to data (t = 0).

Depends on torch only; knows nothing of rewards or training. Every sampler
returns a :class:`Rollout` (or a :class:`TreeRollout`).
"""

from samplers.cfg import guided_average_velocity, guided_velocity
from samplers.conditioning import broadcast_rows, concat_rows, num_rows, select_rows
from samplers.meanflow import induced_velocity, interval_pairs, meanflow_sample
from samplers.ode import dpm_solver_2m, euler, heun
from samplers.rollout import AverageVelocityFn, Rollout, TreeRollout, VelocityFn
from samplers.schedules import shift_time, timesteps
from samplers.sde import (
    SDEStep,
    gaussian_log_prob,
    sde_sample,
    sde_step,
    sliding_window,
    stochastic_steps,
    transition_log_prob,
)
from samplers.tree import tree_nfe, tree_sample

ODE_SOLVERS = {"euler": euler, "heun": heun, "dpm2m": dpm_solver_2m}

__all__ = [
    "ODE_SOLVERS",
    "AverageVelocityFn",
    "Rollout",
    "SDEStep",
    "TreeRollout",
    "VelocityFn",
    "broadcast_rows",
    "concat_rows",
    "dpm_solver_2m",
    "euler",
    "gaussian_log_prob",
    "guided_average_velocity",
    "guided_velocity",
    "heun",
    "induced_velocity",
    "interval_pairs",
    "meanflow_sample",
    "num_rows",
    "sde_sample",
    "sde_step",
    "select_rows",
    "shift_time",
    "sliding_window",
    "stochastic_steps",
    "timesteps",
    "transition_log_prob",
    "tree_nfe",
    "tree_sample",
]
