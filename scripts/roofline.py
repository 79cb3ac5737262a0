"""Roofline measurements shared by the benchmarks: FLOPs counted per phase, the matrix-multiply shapes a
phase runs, and the rate this machine reaches on those same shapes and on a large GEMM.

A phase's *achieved rate* is its counted FLOPs (``torch.utils.flop_counter``: matrix multiplies and
attention, the work that dominates a transformer) over its measured seconds. Its *same-shape GEMM
rate* is what a bare ``torch.mm`` reaches on the phase's own matrix-multiply shapes, weighted by their
FLOPs: the ceiling the phase could reach if everything but its matrix multiplies were free. The
*peak GEMM rate* is a 2048-cubed ``torch.mm``. The ratio achieved / same-shape says how much of a
phase's time goes to work other than its GEMMs (elementwise ops, copies, attention kernels, Python).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


class MatmulShapes(TorchDispatchMode):
    """Records ``(batch, m, k, n)`` of every matrix multiply run inside it, with its count."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: Counter[tuple[int, int, int, int]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in MATMULS:
            first, second = (args[1], args[2]) if func is torch.ops.aten.addmm.default else (args[0], args[1])
            batch = first.shape[0] if first.ndim == 3 else 1
            self.shapes[(batch, first.shape[-2], first.shape[-1], second.shape[-1])] += 1
        return func(*args, **(kwargs or {}))


class PhaseCounter:
    """FLOPs and matrix-multiply shapes of named phases; wrap a function with :meth:`count`."""

    def __init__(self) -> None:
        self.flops: Counter[str] = Counter()
        self.shapes: dict[str, Counter[tuple[int, int, int, int]]] = {}

    def count(self, phase: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            shapes = MatmulShapes()
            with FlopCounterMode(display=False) as counter, shapes:
                result = function(*args, **kwargs)
            self.flops[phase] += counter.get_total_flops()
            self.shapes.setdefault(phase, Counter()).update(shapes.shapes)
            return result

        return counted


def gemm_rate(
    batch: int, m: int, k: int, n: int, min_seconds: float = 0.2, dtype: torch.dtype = torch.float32
) -> float:
    """FLOP/s of ``torch.mm`` (``torch.bmm`` when ``batch > 1``) at one shape in ``dtype``, best of a few runs."""
    left = torch.randn(batch, m, k, dtype=dtype).squeeze(0)
    right = torch.randn(batch, k, n, dtype=dtype).squeeze(0)
    multiply = torch.bmm if batch > 1 else torch.mm
    multiply(left, right)
    best, total, runs = float("inf"), 0.0, 0
    while total < min_seconds or runs < 3:
        start = time.perf_counter()
        multiply(left, right)
        seconds = time.perf_counter() - start
        best, total, runs = min(best, seconds), total + seconds, runs + 1
    return 2 * batch * m * k * n / best


def same_shape_rate(shapes: Counter[tuple[int, int, int, int]], top: int = 8) -> float:
    """The FLOP-weighted harmonic mean of :func:`gemm_rate` over the ``top`` shapes with the most FLOPs
    (the time the GEMMs alone would take, at bare-GEMM speed)."""
    weighted = sorted(
        ((2 * b * m * k * n * count, (b, m, k, n)) for (b, m, k, n), count in shapes.items()), reverse=True
    )
    chosen = weighted[:top]
    flops = sum(work for work, _ in chosen)
    seconds = sum(work / gemm_rate(*shape) for work, shape in chosen)
    return flops / seconds


def peak_gemm_rate() -> float:
    """FLOP/s of a 2048 x 2048 x 2048 float32 ``torch.mm``."""
    return gemm_rate(1, 2048, 2048, 2048, min_seconds=1.0)


def roofline_rows(
    flops: dict[str, float], seconds: dict[str, float], shapes: dict[str, Counter], peak: float
) -> list[dict[str, float | str]]:
    """One row per phase: FLOPs, seconds, achieved, same-shape and peak GFLOP/s, and the ratios."""
    rows: list[dict[str, float | str]] = []
    for phase, work in flops.items():
        achieved = work / seconds[phase]
        ceiling = same_shape_rate(shapes[phase]) if shapes.get(phase) else float("nan")
        rows.append(
            {
                "phase": phase,
                "gflop": work / 1e9,
                "seconds": seconds[phase],
                "achieved_gflops": achieved / 1e9,
                "same_shape_gemm_gflops": ceiling / 1e9,
                "peak_gemm_gflops": peak / 1e9,
                "of_same_shape": achieved / ceiling,
                "of_peak": achieved / peak,
            }
        )
    return rows


def print_roofline(rows: list[dict[str, float | str]]) -> None:
    print(
        f"{'phase':<16}{'GFLOP':>8}{'s':>8}{'GFLOP/s':>9}{'same-shape':>11}{'peak':>7}{'of same':>9}{'of peak':>9}"
    )
    for row in rows:
        print(
            f"{row['phase']:<16}{row['gflop']:>8.1f}{row['seconds']:>8.3f}{row['achieved_gflops']:>9.1f}"
            f"{row['same_shape_gemm_gflops']:>11.1f}{row['peak_gemm_gflops']:>7.1f}"
            f"{row['of_same_shape']:>9.0%}{row['of_peak']:>9.0%}"
        )
