"""The learning benchmark's report (:mod:`bench_learning`): per recipe, mean ± sd over seeds of the held-out
CFG-free score, per task, colour drift and step time; the first crossing of base + each target (images and
training seconds, linear between evaluations, and the ratio to the reference recipe); the baselines. Writes
``bench_learning.json``, ``bench_learning.md`` and five PNGs (:mod:`learning_plots`) into the benchmark's
folder.

Training seconds are the sum of the runs' ``time/step`` (rollout, reward and update; evaluations and
checkpoints excluded), so the evaluation cadence does not move the wall-clock axis.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from learning_plots import plot_held_out, plot_tasks, plot_training_curve, prefix_of

if TYPE_CHECKING:
    from bench_suite import Recipe, Suite

#: per-step training curves of a run: name in the report -> ``metrics.jsonl`` key
TRAINING_CURVES = {"reward_curve": "reward/mean", "reference_mse_curve": "nft/reference_mse"}


def mean_sd(values: list[float]) -> list[float | None]:
    """``[mean, sd]`` (sd ``None`` for one value)."""
    if not values:
        return [None, None]
    return [statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None]


def first_crossing(curve: list[dict[str, float]], threshold: float, axis: str) -> float | None:
    """The ``axis`` value (images or seconds) where the held-out score first reaches ``threshold``, linear
    between the two evaluations around the crossing; ``None`` when it never does."""
    for before, after in zip(curve, curve[1:]):
        if after["held_out"] >= threshold > before["held_out"]:
            share = (threshold - before["held_out"]) / (after["held_out"] - before["held_out"])
            return before[axis] + share * (after[axis] - before[axis])
    return 0.0 if curve and curve[0]["held_out"] >= threshold else None


def read_run(directory: Path, images_per_step: int, base_score: float) -> dict[str, Any]:
    """One finished run: its held-out curve (from the base at 0), per-step training curves
    (``TRAINING_CURVES``: reward, and the drift from the base where logged) and final scores."""
    rows = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines() if line]
    final = json.loads((directory / "summary.json").read_text())["tuned"]["1"]
    prefix = prefix_of(final)
    seconds, curve = 0.0, [{"step": 0, "images": 0, "seconds": 0.0, "held_out": base_score}]
    training: dict[str, list[dict[str, float]]] = {name: [] for name in TRAINING_CURVES}
    step_times = []
    for row in rows:
        if row.get("step", 0) == 0:
            continue
        seconds += row.get("time/step", 0.0)
        step_times.append(row.get("time/step", 0.0))
        for name, key in TRAINING_CURVES.items():
            if key in row:
                training[name].append(
                    {"step": row["step"], "images": row["step"] * images_per_step, "value": row[key]}
                )
        if f"eval/{prefix}/overall" in row:
            point = {"step": row["step"], "images": row["step"] * images_per_step, "seconds": seconds}
            curve.append({**point, "held_out": row[f"eval/{prefix}/overall"]})
    return {
        "curve": curve,
        **training,
        "final": {key: value for key, value in final.items() if key.startswith(f"{prefix}/")},
        "held_out": final[f"{prefix}/overall"],
        "drift": final.get("drift/colour_tv"),
        "seconds_per_step": statistics.median(step_times) if step_times else None,
        "training_seconds": seconds,
    }


def summarise_recipe(recipe: Recipe, runs: dict[int, dict], base_score: float, targets: list[float]) -> dict:
    """Mean ± sd over seeds of one recipe's runs (module docstring)."""
    seeds = sorted(runs)
    tasks = list(runs[seeds[0]]["final"])
    steps = sorted(set.intersection(*({point["step"] for point in runs[s]["curve"]} for s in seeds)))
    curve = []
    for step in steps:
        points = [next(p for p in runs[s]["curve"] if p["step"] == step) for s in seeds]
        held, secs = mean_sd([p["held_out"] for p in points]), mean_sd([p["seconds"] for p in points])
        curve.append(
            {"step": step, "images": step * recipe.images_per_step, "held_out": held, "seconds": secs}
        )
    to_target = {}
    for target in targets:
        threshold = base_score + target
        images = [first_crossing(runs[s]["curve"], threshold, "images") for s in seeds]
        seconds = [first_crossing(runs[s]["curve"], threshold, "seconds") for s in seeds]
        to_target[f"{target:g}"] = {
            "threshold": threshold,
            "reached": sum(value is not None for value in images),
            "of": len(seeds),
            "images": mean_sd([v for v in images if v is not None]),
            "seconds": mean_sd([v for v in seconds if v is not None]),
        }
    return {
        "recipe": recipe.path,
        "base_model": recipe.base_model,
        "images_per_step": recipe.images_per_step,
        "steps": recipe.steps,
        "seeds": seeds,
        "held_out": mean_sd([runs[s]["held_out"] for s in seeds]),
        "per_task": {task: mean_sd([runs[s]["final"][task] for s in seeds]) for task in tasks},
        "drift": mean_sd([runs[s]["drift"] for s in seeds if runs[s]["drift"] is not None]),
        "seconds_per_step": mean_sd([runs[s]["seconds_per_step"] for s in seeds]),
        "training_seconds": mean_sd([runs[s]["training_seconds"] for s in seeds]),
        "curve": curve,
        "time_to_target": to_target,
        "runs": {str(s): runs[s] for s in seeds},
    }


def add_ratios(algorithms: dict[str, dict], reference: str) -> None:
    """Time-to-target ratio to the reference recipe (images and training seconds), where the reference
    reached the target in every seed: the ratio of the means where this recipe did too, and a lower bound
    (its whole budget over the reference's time, ``..._ratio_is_lower_bound``) where it never did."""
    if reference not in algorithms:
        return
    for summary in algorithms.values():
        budget = {
            "images": summary["steps"] * summary["images_per_step"],
            "seconds": summary["training_seconds"][0],
        }
        for key, entry in summary["time_to_target"].items():
            theirs = algorithms[reference]["time_to_target"][key]
            for axis in ("images", "seconds"):
                ratio, lower_bound = None, False
                if theirs["reached"] == theirs["of"] and theirs[axis][0]:
                    if entry["reached"] == entry["of"]:
                        ratio = entry[axis][0] / theirs[axis][0]
                    elif entry["reached"] == 0:
                        ratio, lower_bound = budget[axis] / theirs[axis][0], True
                entry[f"{axis}_ratio_to_{reference}"] = ratio
                entry[f"{axis}_ratio_is_lower_bound"] = lower_bound


def cell(value: list[float | None], digits: int = 3) -> str:
    mean, sd = value
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def target_cell(entry: dict, axis: str, reference: str) -> str:
    """``mean ± sd (ratio×)``; ``not reached (> ratio×)`` where no seed reached the target."""
    ratio = entry.get(f"{axis}_ratio_to_{reference}")
    if entry["reached"] == 0:
        return "not reached" + (f" (> {ratio:.1f}×)" if ratio is not None else "")
    text = cell(entry[axis], 0) + (f" ({ratio:.2f}×)" if ratio is not None else "")
    return text + ("" if entry["reached"] == entry["of"] else f" [{entry['reached']}/{entry['of']} seeds]")


def markdown(report: dict) -> str:
    """The report's tables as Markdown."""
    reference = report["reference"]
    lines = [
        f"Suite `{report['suite']}`, {report['date']}, {report['machine']['cpus']} CPU cores "
        f"({report['machine']['platform']}), seeds {report['seeds']}, {report['images_per_run']} images per run"
        + "".join(f" ({name}: {images})" for name, images in report.get("recipe_images", {}).items())
        + ".",
        f"Command: `{report['command']}`",
        "",
        "| recipe | seeds | held-out CFG-free | gain over base | colour drift | s/step | training s |"
        + "".join(f" images to +{t} | training s to +{t} |" for t in report["time_to_target_keys"]),
        "|---|---|---|---|---|---|---|" + "---|---|" * len(report["time_to_target_keys"]),
    ]
    for name, summary in report["algorithms"].items():
        base = report["baselines"][summary["base_model"]]["cfg"]["1"]
        gain = summary["held_out"][0] - base[f"{prefix_of(base)}/overall"]
        row = (
            f"| {name} | {len(summary['seeds'])} | {cell(summary['held_out'])} | {gain:+.3f} | "
            f"{cell(summary['drift'])} | {cell(summary['seconds_per_step'], 2)} | "
            f"{cell(summary['training_seconds'], 0)} |"
        )
        for key in report["time_to_target_keys"]:
            entry = summary["time_to_target"][key]
            row += (
                f" {target_cell(entry, 'images', reference)} | {target_cell(entry, 'seconds', reference)} |"
            )
        lines.append(row)
    blanks = " | " * (4 + 2 * len(report["time_to_target_keys"]))
    for model, baseline in report["baselines"].items():  # the baselines in the same table (held-out only)
        key = f"{prefix_of(baseline['cfg']['1'])}/overall"
        labelled = [(f"base CFG {scale}", scores) for scale, scores in baseline["cfg"].items()]
        labelled += [(f"best-of-{n} (verifier)", scores) for n, scores in baseline["best_of"].items()]
        for label, scores in labelled:
            gain = scores[key] - baseline["cfg"]["1"][key]
            lines.append(f"| {label}, {model} | | {scores[key]:.3f} | {gain:+.3f}{blanks.rstrip()}")
    lines += [
        "",
        f"Time-to-target: the first crossing of base CFG-free + target, linear between evaluations; "
        f"in brackets the ratio to `{reference}` (where every seed of both reached it; `> r×`: never "
        f"reached, so at least the whole budget over `{reference}`'s time).",
        "",
        "| baseline | model | held-out | NFE per image | generation s per image | pass@N |",
        "|---|---|---|---|---|---|",
    ]
    for model, baseline in report["baselines"].items():
        key = f"{prefix_of(baseline['cfg']['1'])}/overall"
        for scale, scores in baseline["cfg"].items():
            nfe = baseline["num_steps"] * (1 if scale == "1" else 2)
            lines.append(f"| base CFG {scale} | {model} | {scores[key]:.3f} | {nfe} | | |")
        for n, scores in baseline["best_of"].items():
            lines.append(
                f"| best-of-{n} (verifier) | {model} | {scores[key]:.3f} | {scores['nfe_per_image']} | "
                f"{scores['generation_seconds_per_image']:.3f} | {scores['pass_at_n']:.3f} |"
            )
    first = next(iter(report["algorithms"].values()), None)
    if first is not None:
        tasks = list(first["per_task"])
        lines += [
            "",
            "| recipe | " + " | ".join(t.split("/")[1] for t in tasks) + " |",
            "|---|" + "---|" * len(tasks),
        ]
        for name, summary in report["algorithms"].items():
            lines.append(f"| {name} | " + " | ".join(cell(summary["per_task"][t]) for t in tasks) + " |")
        for model, baseline in report["baselines"].items():
            for label, scores in [(f"base CFG {s}", v) for s, v in baseline["cfg"].items()] + [
                (f"best-of-{n}", v) for n, v in baseline["best_of"].items()
            ]:
                if all(t in scores for t in tasks):
                    lines.append(
                        f"| {label} ({model}) | " + " | ".join(f"{scores[t]:.3f}" for t in tasks) + " |"
                    )
    if "raft" in report["algorithms"]:
        raft = report["algorithms"]["raft"]["held_out"][0]
        behind = [n for n, s in report["algorithms"].items() if n != "raft" and s["held_out"][0] <= raft]
        lines += ["", "Not above RAFT at equal images: " + (", ".join(behind) if behind else "none") + "."]
    return "\n".join(lines) + "\n"


def write_report(
    out: Path,
    suite_name: str,
    suite: Suite,
    recipes: dict[str, Recipe],
    baselines: dict[str, Any],
    command: str,
) -> dict[str, Any]:
    """Read every finished run, summarise, print the tables and write the JSON, Markdown and PNGs."""
    algorithms = {}
    for name, recipe in recipes.items():
        if recipe.base_model not in baselines:
            continue
        base = baselines[recipe.base_model]["cfg"]["1"]
        base_score = base[f"{prefix_of(base)}/overall"]
        runs = {}
        for seed in suite.seeds:
            directory = recipe.run_dir(out, seed)
            summary = directory / "summary.json"
            if summary.is_file() and "tuned" in json.loads(summary.read_text()):
                runs[seed] = read_run(directory, recipe.images_per_step, base_score)
        if runs:
            algorithms[name] = summarise_recipe(recipe, runs, base_score, suite.targets)
    add_ratios(algorithms, suite.reference)
    report = {
        "suite": suite_name,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "seeds": suite.seeds,
        "images_per_run": suite.images,
        "recipe_images": suite.recipe_images,
        "eval_every_images": suite.eval_every_images,
        "eval_images_per_task": suite.eval_images_per_task,
        "reference": suite.reference,
        "time_to_target_keys": [f"{t:g}" for t in suite.targets],
        "baselines": baselines,
        "algorithms": algorithms,
    }
    (out / "bench_learning.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "bench_learning.md").write_text(text)
    plot_held_out(report, "images", out / "held_out_vs_images.png")
    plot_held_out(report, "seconds", out / "held_out_vs_seconds.png")
    plot_training_curve(report, "reward_curve", "training reward", out / "training_reward.png")
    plot_training_curve(report, "reference_mse_curve", "MSE of v to v_ref", out / "reference_drift.png", True)
    plot_tasks(report, out / "per_task.png")
    print(text)
    print(f"wrote {out / 'bench_learning.json'}, {out / 'bench_learning.md'} and 5 PNGs in {out}")
    return report
