"""The busy-CPU warning measures what other processes do now: it fires beside a real busy process, not for
this process's own work, and not because the load average still remembers a job that has ended."""

import math
import os
import subprocess
import sys
import time
import warnings

import pytest

from flowrl import busy

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def spinners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def measured(seconds: float = 0.5) -> float:
    window = busy.OtherProcesses()
    time.sleep(seconds)
    return window.busy_cores()


def test_it_fires_beside_real_busy_processes():
    cores = busy.available_cores()
    processes = spinners(math.ceil(max(1.0, cores / 2)))  # half the cores: measures just under half
    try:
        time.sleep(0.5)  # started
        with pytest.warns(UserWarning, match=f"other processes keep [0-9.]+ of the {cores} cores busy"):
            busy.warn_if_busy(2, "flowrl train")
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_this_process_s_own_work_is_not_counted():
    baseline = measured()
    window = busy.OtherProcesses()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:  # a core of this process's own work
        pass
    assert window.busy_cores() < baseline + 0.5


def test_the_load_average_of_a_job_that_ended_does_not_fire(monkeypatch):
    """What used to fire after the set-up or the test suite: a one-minute load average still high."""
    if measured() >= 0.5:
        pytest.skip("other processes are using this machine's CPU now; the quiet case needs it idle")
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        busy.warn_if_busy(2, "flowrl train")
