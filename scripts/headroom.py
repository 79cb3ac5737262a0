"""How much can alignment gain? Mean accuracy against best-of-K (pass@K) on the held-out prompts.

For each model and guidance scale the held-out evaluation
(:func:`flowrl.evaluation.evaluate`) runs ``K`` times with disjoint seeds
(round ``k`` uses seed ``k * 1_000_003``; round 0 is the trainer's own
evaluation). Per task: the mean strict accuracy over all ``K`` rounds (the
evaluation's score with ``K`` times the images), its spread between rounds,
and pass@K, the share of evaluation items (prompt + seed slot) that at least
one of the ``K`` samples gets right. pass@K bounds what sharpening the
model's own distribution can reach: an RL method that only moves probability
between samples the model already draws cannot beat it.

The ``K`` samples of an item are also a group as RL draws one (one prompt, ``K``
noises), so the same run measures the signal a group carries per task: the
within-group standard deviation of the strict verdict and of the partial score
(mean over items, ``ddof = 0``) and the share of groups whose ``K`` rewards are all
equal (which teach a group-normalised method nothing).

    python scripts/headroom.py --models shapes-base runs/main/model --cfg 1 3 --k 8 --out outputs/headroom.json

Columns: mean, its spread between rounds, pass@K; the partial score's mean; the within-group std of the
strict verdict (``std s``) and of the partial score (``std p``); the share of groups all equal (``eq``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from flowrl.evaluation import evaluate
from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.worlds import WORLDS

ROUND_SEED_STRIDE = 1_000_003
#: per task, besides mean, round_std and pass@K: the signal in a group of the K samples of an item
GROUP_KEYS = (
    "partial_mean",
    "strict_group_std",
    "partial_group_std",
    "strict_equal_groups",
    "partial_equal_groups",
)


def headroom(model_name: str, guidance_scale: float, k: int, images_per_task: int, num_steps: int) -> dict:
    """Per-task mean accuracy, its between-round std and pass@K of one model at one guidance scale."""
    world = WORLDS["shapes"]
    sampler = partial(generate, load_shapes_model(model_name))
    strict_rounds, partial_rounds, tags = [], [], None
    for round_index in range(k):
        _, _, items, rewards = evaluate(
            sampler,
            world.prompts("test"),
            images_per_task,
            num_steps,
            guidance_scale,
            seed=round_index * ROUND_SEED_STRIDE,
            world=world,
        )
        strict_rounds.append(rewards["strict"].numpy())
        partial_rounds.append(rewards["partial"].float().numpy())
        tags = np.array([record["tag"] for record, _ in items])
    strict = np.stack(strict_rounds, axis=1)  # [items, K]
    partial_scores = np.stack(partial_rounds, axis=1)
    tasks = {}
    for task in world.tasks:
        rows, partial_rows = strict[tags == task], partial_scores[tags == task]
        tasks[task] = {
            "mean": float(rows.mean()),
            "round_std": float(rows.mean(axis=0).std()),
            f"pass@{k}": float(rows.max(axis=1).mean()),
            "partial_mean": float(partial_rows.mean()),
            "strict_group_std": float(rows.std(axis=1).mean()),
            "partial_group_std": float(partial_rows.std(axis=1).mean()),
            "strict_equal_groups": float((rows.std(axis=1) == 0).mean()),
            "partial_equal_groups": float((partial_rows.std(axis=1) == 0).mean()),
        }
    round_overall = np.mean([strict[tags == task].mean(axis=0) for task in world.tasks], axis=0)  # [K]
    tasks["overall"] = {
        "mean": float(round_overall.mean()),
        "round_std": float(round_overall.std()),
        **{
            key: float(np.mean([tasks[task][key] for task in world.tasks]))
            for key in (f"pass@{k}", *GROUP_KEYS)
        },
    }
    return tasks


def plot(results: list[dict], k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(results[0]["tasks"])
    width = 0.8 / len(results)
    figure, axis = plt.subplots(figsize=(10, 4))
    for index, result in enumerate(results):
        positions = np.arange(len(tasks)) + index * width
        label = f"{result['model']} cfg {result['guidance_scale']:g}"
        bars = axis.bar(positions, [result["tasks"][t]["mean"] for t in tasks], width, label=f"{label}: mean")
        axis.bar(
            positions,
            [result["tasks"][t][f"pass@{k}"] - result["tasks"][t]["mean"] for t in tasks],
            width,
            bottom=[result["tasks"][t]["mean"] for t in tasks],
            color=bars.patches[0].get_facecolor(),
            alpha=0.3,
            label=f"{label}: up to pass@{k}",
        )
    axis.set_xticks(np.arange(len(tasks)) + 0.4 - width / 2, tasks)
    axis.set_ylim(0, 1)
    axis.set_ylabel("held-out strict accuracy")
    axis.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", nargs="+", default=["shapes-base"], help="shipped names or model dirs")
    parser.add_argument("--cfg", nargs="+", type=float, default=[1.0], help="guidance scales")
    parser.add_argument("--k", type=int, default=8, help="samples per evaluation item (rounds)")
    parser.add_argument("--images-per-task", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="Euler steps, as the evaluation")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="outputs/headroom.json")
    args = parser.parse_args()
    if args.k < 1:
        parser.error(f"--k must be >= 1, got {args.k}")
    if args.threads:
        torch.set_num_threads(args.threads)

    results = []
    for model_name in args.models:
        for guidance_scale in args.cfg:
            start = time.perf_counter()
            tasks = headroom(model_name, guidance_scale, args.k, args.images_per_task, args.steps)
            results.append(
                {
                    "model": model_name,
                    "guidance_scale": guidance_scale,
                    "tasks": tasks,
                    "seconds": time.perf_counter() - start,
                }
            )

    header = (
        f"{'model':28s} {'cfg':>4s} {'task':14s} {'mean':>6s} {'±round':>7s} {f'pass@{args.k}':>7s}"
        f" {'partial':>7s} {'std s':>6s} {'std p':>6s} {'eq s':>5s} {'eq p':>5s}"
    )
    print(header)
    print("-" * len(header))
    for result in results:
        for task, values in result["tasks"].items():
            print(
                f"{result['model'][-28:]:28s} {result['guidance_scale']:4g} {task:14s} "
                f"{values['mean']:6.3f} {values['round_std']:7.3f} {values[f'pass@{args.k}']:7.3f}"
                + "".join(
                    f" {values[key]:{width}.3f}"
                    for key, width in zip(GROUP_KEYS, (7, 6, 6, 5, 5), strict=True)
                )
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "k": args.k,
        "images_per_task": args.images_per_task,
        "num_steps": args.steps,
        "machine": {"platform": platform.platform(), "threads": torch.get_num_threads()},
        "results": results,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(results, args.k, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
