"""Where a trainer's step time goes, by operator, for any command (flowrl's or a reference trainer's).

A command runs with a ``sitecustomize`` on its ``PYTHONPATH`` that, when ``FLOWRL_OP_PROFILE`` names a
folder, runs the whole process under ``torch.profiler`` (CPU activity) and writes each operator's self
CPU time and call count to ``<folder>/<pid>.json`` at exit (every Python process of the command: a
``torch.distributed.run`` launcher and its workers alike). Run a trainer for ``S`` and ``2S`` steps and

    per step (op) = (T_2S(op) - T_S(op)) / S

removes start-up and loading, as ``bench_peers.py`` does for wall time. Each process also records its
wall-clock and CPU seconds (:data:`WALL`, :data:`PROCESS_CPU`); the step's wall-clock time beside the
operators' self time says how much of it is spent outside torch operators (Python, I/O, waiting). Times carry the profiler's own
overhead (a few microseconds an operator), the same on both sides; compare shares and differences, not
the absolute step time. Used by ``bench_peers.py --profile``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

ENVIRONMENT_KEY = "FLOWRL_OP_PROFILE"
#: records beside the operators: the process's wall-clock and CPU seconds (all threads) while profiled
WALL, PROCESS_CPU = "<wall clock>", "<process CPU>"

SITECUSTOMIZE = f'''
import os

if os.environ.get("{ENVIRONMENT_KEY}"):
    import atexit
    import json
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    _started = time.perf_counter(), time.process_time()
    _profiler = profile(activities=[ProfilerActivity.CPU])
    _profiler.start()

    def _write_operator_times():
        _profiler.stop()
        rows = {{event.key: [event.self_cpu_time_total, event.count] for event in _profiler.key_averages()}}
        rows["{WALL}"] = [(time.perf_counter() - _started[0]) * 1e6, 1]
        rows["{PROCESS_CPU}"] = [(time.process_time() - _started[1]) * 1e6, 1]
        path = os.path.join(os.environ["{ENVIRONMENT_KEY}"], f"{{os.getpid()}}.json")
        with open(path, "w") as handle:
            json.dump(rows, handle)

    atexit.register(_write_operator_times)
'''

#: operator families, first match wins (names as torch.profiler reports them)
CATEGORIES: list[tuple[str, re.Pattern[str]]] = [
    ("attention", re.compile(r"scaled_dot_product|flash_attention|_efficient_attention|attention")),
    ("GEMM", re.compile(r"^aten::(addmm|mm|bmm|matmul|linear|baddbmm|addbmm)$")),
    ("convolution", re.compile(r"conv")),
    ("normalisation", re.compile(r"norm")),
    ("optimizer", re.compile(r"Optimizer|_foreach|adam", re.IGNORECASE)),
    ("copies and casts", re.compile(r"^aten::(copy_|to|_to_copy|clone|contiguous|cat|stack|index|empty)")),
    ("element-wise", re.compile(r"^aten::")),
]


def write_hook(folder: Path) -> Path:
    """``folder/sitecustomize.py`` (the profiling hook); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


def hooked(command: list[str], hook_folder: Path, out: Path) -> tuple[list[str], dict[str, str]]:
    """``command`` and its environment with the hook on every ``PYTHONPATH`` it sets: the process's own,
    and any ``PYTHONPATH=...`` word of the command itself (as in ``env PYTHONPATH=checkout python ...``)."""
    environment = dict(os.environ)
    environment[ENVIRONMENT_KEY] = str(out)
    environment["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(hook_folder), environment.get("PYTHONPATH", "")) if part
    )
    words = [
        f"PYTHONPATH={hook_folder}{os.pathsep}{word.removeprefix('PYTHONPATH=')}"
        if word.startswith("PYTHONPATH=")
        else word
        for word in command
    ]
    return words, environment


def operator_times(folder: Path) -> dict[str, tuple[float, int]]:
    """``(self CPU seconds, calls)`` per operator, summed over every process that wrote to ``folder``
    (:data:`WALL`: the longest process's)."""
    totals: dict[str, tuple[float, int]] = {}
    for path in folder.glob("*.json"):
        for name, (microseconds, count) in json.loads(path.read_text()).items():
            seconds, calls = totals.get(name, (0.0, 0))
            if name == WALL:
                totals[name] = (max(seconds, microseconds / 1e6), 1)
            else:
                totals[name] = (seconds + microseconds / 1e6, calls + count)
    return totals


def per_step(
    short: dict[str, tuple[float, int]], long: dict[str, tuple[float, int]], steps: int
) -> dict[str, tuple[float, float]]:
    """``(seconds, calls)`` per step, ``(long - short) / steps``, for operators whose time grew."""
    step = {}
    for name in set(short) | set(long):
        seconds = (long.get(name, (0.0, 0))[0] - short.get(name, (0.0, 0))[0]) / steps
        calls = (long.get(name, (0.0, 0))[1] - short.get(name, (0.0, 0))[1]) / steps
        if seconds > 0:
            step[name] = (seconds, calls)
    return step


def category_of(name: str) -> str:
    for category, pattern in CATEGORIES:
        if pattern.search(name):
            return category
    return "other"


def by_category(times: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Seconds per :data:`CATEGORIES` family (``other``: autograd nodes, Python-side records); the
    process records :data:`WALL` and :data:`PROCESS_CPU` are left out."""
    totals: dict[str, float] = {}
    for name, (seconds, _calls) in times.items():
        if name in (WALL, PROCESS_CPU):
            continue
        category = category_of(name)
        totals[category] = totals.get(category, 0.0) + seconds
    return totals
