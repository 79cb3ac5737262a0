"""A warning when the CPU is already busy: two CPU-bound jobs on the same cores oversubscribe their threads.

Measured on 2 cores (``scripts/bench_train.py``, the main job's step): alone 2.4 s; two at once with 2
threads each 9.8 s per step (4x, not the 2x of sharing fairly, because OpenMP threads spin while
they wait); with ``OMP_WAIT_POLICY=PASSIVE`` two at once took 4.5 s each, but a job alone 3.0 s.
"""

from __future__ import annotations

import os
import warnings


def busy_cores() -> float:
    """The 1-minute load average: how many cores other jobs kept busy lately (0 where unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def warn_if_busy(threads: int, what: str) -> None:
    """Warn when the load already occupies half the cores or more before ``what`` starts its ``threads``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = busy_cores()
    if load >= max(1.0, cores / 2):
        warnings.warn(
            f"{what}: the CPU is already busy (load average {load:.1f} on {cores} cores); with {threads} threads "
            "next to another CPU-bound job every step can run several times slower (thread "
            "oversubscription). Run one job at a time, or give each fewer threads "
            "(training.threads=1, OMP_NUM_THREADS=1) or OMP_WAIT_POLICY=PASSIVE",
            stacklevel=2,
        )
