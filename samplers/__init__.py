"""Samplers: integrate a velocity field ``v(x, t, cond)`` from noise (t = 1) to data (t = 0).

Depends on torch only; knows nothing of rewards or training.
"""

from samplers.cfg import guided_velocity
from samplers.ode import euler
from samplers.schedules import shift_time, timesteps

__all__ = ["euler", "guided_velocity", "shift_time", "timesteps"]
