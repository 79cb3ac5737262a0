"""The learning benchmark's plots (:mod:`learning_report` writes them): held-out score against training
images or seconds with the baselines, a per-step training curve (reward, drift from the base) and the
per-task scores, each a mean ± sd band or bar over seeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CURVE_WINDOW = 10  # steps in the rolling mean of the training curves
PREFIXES = ("geneval", "videoeval", "i2veval")  # the score prefixes of the worlds' evaluations


def prefix_of(scores: dict[str, Any]) -> str:
    """The world's score prefix of an evaluation's scores (``geneval/overall`` -> ``geneval``)."""
    return next(prefix for prefix in PREFIXES if f"{prefix}/overall" in scores)


def band(axis: Any, x: list[float], values: list[list[float | None]], label: str) -> None:
    means = np.array([v[0] for v in values], dtype=float)
    sds = np.array([v[1] or 0.0 for v in values], dtype=float)
    (line,) = axis.plot(x, means, marker="o", markersize=3, label=label)
    axis.fill_between(x, means - sds, means + sds, color=line.get_color(), alpha=0.2)


def baseline_lines(axis: Any, report: dict) -> None:
    styles = {"1": ("k", "--"), "3": ("grey", "--")}
    for model, baseline in report["baselines"].items():
        key = f"{prefix_of(baseline['cfg']['1'])}/overall"
        for scale, scores in baseline["cfg"].items():
            color, style = styles.get(scale, ("grey", "-."))
            axis.axhline(scores[key], color=color, linestyle=style, linewidth=1, label=f"{model} CFG {scale}")
        for index, (n, scores) in enumerate(baseline["best_of"].items()):
            color = ("tab:purple", "tab:pink", "tab:brown")[index % 3]
            axis.axhline(scores[key], color=color, linestyle=":", linewidth=1, label=f"{model} best-of-{n}")


def plot_held_out(report: dict, axis_key: str, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, summary in report["algorithms"].items():
        x = [p["images"] if axis_key == "images" else p["seconds"][0] for p in summary["curve"]]
        band(axis, x, [p["held_out"] for p in summary["curve"]], name)
    baseline_lines(axis, report)
    axis.set_xlabel("training images" if axis_key == "images" else "training seconds (mean over seeds)")
    axis.set_ylabel("held-out CFG-free score (mean ± sd over seeds)")
    axis.set_title(f"learning benchmark `{report['suite']}`")
    axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_training_curve(report: dict, curve_key: str, label: str, path: Path, log: bool = False) -> None:
    """A per-step training curve (``reward_curve`` or ``reference_mse_curve``) against training images: its
    rolling mean over ``CURVE_WINDOW`` steps, mean ± sd over seeds; recipes that do not log it are left
    out."""
    figure, axis = plt.subplots(figsize=(8, 5))
    for name, summary in report["algorithms"].items():
        curves = [[p["value"] for p in run[curve_key]] for run in summary["runs"].values()]
        length = min(len(c) for c in curves)
        if length == 0 or (log and not any(value > 0 for c in curves for value in c)):
            continue  # not logged, or all zero (a reference term switched off) on a log axis
        smoothed = np.array(
            [
                np.convolve(c[:length], np.ones(CURVE_WINDOW), "valid") / CURVE_WINDOW
                if length >= CURVE_WINDOW
                else np.array(c[:length])
                for c in curves
            ]
        )
        first_run = next(iter(summary["runs"].values()))
        images = [p["images"] for p in first_run[curve_key][:length]][-smoothed.shape[1] :]
        means, sds = (
            smoothed.mean(axis=0),
            smoothed.std(axis=0, ddof=1) if len(curves) > 1 else 0 * smoothed[0],
        )
        (line,) = axis.plot(images, means, label=name)
        axis.fill_between(images, means - sds, means + sds, color=line.get_color(), alpha=0.2)
    axis.set_xlabel("training images")
    axis.set_ylabel(f"{label} (rolling mean of {CURVE_WINDOW} steps, mean ± sd over seeds)", fontsize=8)
    if log:
        axis.set_yscale("log")
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_tasks(report: dict, path: Path) -> None:
    names = list(report["algorithms"])
    figure, axis = plt.subplots(figsize=(10, 4.5))
    if names:
        tasks = list(report["algorithms"][names[0]]["per_task"])
        width = 0.8 / len(names)
        for index, name in enumerate(names):
            values = [report["algorithms"][name]["per_task"][t] for t in tasks]
            axis.bar(
                np.arange(len(tasks)) + index * width,
                [v[0] for v in values],
                width,
                yerr=[v[1] or 0.0 for v in values],
                capsize=2,
                label=name,
            )
        axis.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2, [t.split("/")[1] for t in tasks])
        base = report["baselines"][report["algorithms"][names[0]]["base_model"]]["cfg"]["1"]
        for index, task in enumerate(tasks):
            axis.hlines(
                base.get(task, np.nan),
                index - width / 2,
                index + 0.8 - width / 2,
                colors="k",
                linestyles="--",
            )
    axis.set_ylim(0, 1)
    axis.set_ylabel("held-out CFG-free accuracy (dashed: base)")
    axis.legend(fontsize=7, ncol=4)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
