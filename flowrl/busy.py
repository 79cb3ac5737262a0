"""A warning when other processes keep the CPU busy: two CPU-bound jobs on the same cores oversubscribe
their threads.

Measured on 2 cores (``scripts/bench_train.py``, the main job's step): alone 2.4 s; two at once with 2
threads each 9.8 s per step (4x, not the 2x of sharing fairly, because OpenMP threads spin while
they wait); with ``OMP_WAIT_POLICY=PASSIVE`` two at once took 4.5 s each, but a job alone 3.0 s.

What is busy is measured, not guessed: the CPU time the whole machine spends over a window minus what
this run spends (this process, and its sibling ranks when a launcher started several), with psutil
(``/proc/stat`` on Linux). The trainer opens the window when it starts and reads it once the model has
loaded, so the measurement costs no waiting. The load average, used before, lags by a minute: it warned
right after the set-up or the test suite had finished.
"""

from __future__ import annotations

import os
import time
import warnings

import psutil

#: the shortest window (seconds) a measurement waits for
MIN_WINDOW = 0.25
#: warn when other processes keep this share of the cores busy (at least ``MIN_BUSY_CORES``): one
#: CPU-bound job on 2 cores measures 0.95-1.0 cores over a short window, so "half" must sit below that
BUSY_SHARE = 0.4
MIN_BUSY_CORES = 0.75


def _working_seconds(times: psutil._common.scputimes) -> float:  # type: ignore[name-defined]
    """CPU seconds spent working (not idle, not waiting for I/O) in ``psutil.cpu_times()``'s counters."""
    return sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def run_processes() -> list[psutil.Process]:
    """This process, and its sibling ranks when a launcher (``accelerate launch``, ``torchrun``) started it."""
    me = psutil.Process()
    parent = me.parent() if "LOCAL_RANK" in os.environ else None
    siblings = [child for child in parent.children() if child.pid != me.pid] if parent else []
    return [me, *siblings]


class OtherProcesses:
    """A window, open from construction, over the CPU time of every process but this run's."""

    def __init__(self) -> None:
        self.processes = run_processes()
        self.machine, self.own, self.start = psutil.cpu_times(), self._own_seconds(), time.perf_counter()

    def _own_seconds(self) -> float:
        total = 0.0
        for process in self.processes:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def busy_cores(self) -> float:
        """Cores other processes kept busy since the window opened (waiting until it is ``MIN_WINDOW`` long)."""
        time.sleep(max(0.0, MIN_WINDOW - (time.perf_counter() - self.start)))
        machine, own = psutil.cpu_times(), self._own_seconds()
        elapsed = time.perf_counter() - self.start
        others = _working_seconds(machine) - _working_seconds(self.machine) - (own - self.own)
        return max(0.0, others / elapsed)


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def warn_if_busy(threads: int, what: str, window: OtherProcesses | None = None) -> None:
    """Warn when other processes keep ``BUSY_SHARE`` of the cores or more busy (measured over ``window``,
    or over ``MIN_WINDOW`` from now) as ``what`` starts its ``threads``."""
    cores, busy = available_cores(), (window or OtherProcesses()).busy_cores()
    if busy >= max(MIN_BUSY_CORES, BUSY_SHARE * cores):
        warnings.warn(
            f"{what}: other processes keep {busy:.1f} of the {cores} cores busy; with {threads} threads "
            "next to another CPU-bound job every step can run several times slower (thread "
            "oversubscription). Run one job at a time, or give each fewer threads "
            "(training.threads=1, OMP_NUM_THREADS=1) or OMP_WAIT_POLICY=PASSIVE",
            stacklevel=2,
        )
