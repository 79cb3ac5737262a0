"""Benchmark the GRPO family: per-iteration time and network evaluations, and reward per wall-clock second.

Part 1 (measured here, one process, one after the other): flat Flow-GRPO
(every stochastic step trained), BranchGRPO (no pruning), BranchGRPO with
depth pruning and BranchGRPO-Mix, all with the same number of final images
per prompt (the group size, 8) and prompts per iteration, on the shipped
shapes base model. For each: median seconds per iteration (after a warm-up),
rollout network evaluations per final image, trained transitions and
training network evaluations per iteration.

Part 2 (from finished runs, ``--runs``): the reward each recipe reached per
wall-clock second against DiffusionNFT on the same world. Each run's own
resolved config is re-timed here (quiet seconds per iteration, so runs that
shared the machine with other work are compared fairly); its wall-clock is
``steps x seconds per iteration``. Reported: the gain of the training reward
(mean of the last 10 steps minus the first 10) and of the held-out CFG-free
score, and both per minute; plus a PNG of training reward against that
wall-clock.

    python scripts/bench_grpo.py --iterations 3 --runs runs/main runs/shapes_flowgrpo ... --out outputs/bench_grpo.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import matplotlib
import torch
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from flowrl.config import load_config  # noqa: E402
from flowrl.policy import OLD, REFERENCE  # noqa: E402
from flowrl.run_log import read_metrics  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402
from rewards import AsyncScorer  # noqa: E402

#: the BranchGRPO recipes' batch (one tree of 8 leaves per prompt), for Flow-GRPO too
EIGHT_BY_EIGHT = ["training.prompts_per_step=8", "training.group_size=8"]
#: (name, recipe, overrides): the same 8 prompts x 8 final images per iteration for all of them
VARIANTS = [
    (
        "flow_grpo (flat)",  # every step stochastic and trained, noise per sample: the reference's form
        "configs/shapes_flowgrpo.yaml",
        [*EIGHT_BY_EIGHT, "algorithm.sde_window_size=0", "algorithm.same_group_noise=false"],
    ),
    ("flow_grpo (window 3, the recipe)", "configs/shapes_flowgrpo.yaml", EIGHT_BY_EIGHT),
    ("branch_grpo", "configs/shapes_branchgrpo.yaml", ["algorithm.width_pruning=none"]),
    (
        "branch_grpo + depth pruning",  # the reference's: the transitions into depths 1-6 are not trained
        "configs/shapes_branchgrpo.yaml",
        ["algorithm.depth_pruning=[1,2,3,4,5,6]", "algorithm.width_pruning=none"],
    ),
    ("branch_grpo + width pruning", "configs/shapes_branchgrpo.yaml", []),
    ("branch_grpo mix", "configs/shapes_branchgrpo_mix.yaml", []),
]


class EvaluationCounter:
    """Rows through the sampling network (rollout) and through the trained and reference networks."""

    def __init__(self, trainer: Trainer) -> None:
        self.rollout = self.training = 0
        trainer.policy.copies.compute[OLD].register_forward_hook(
            lambda _m, inputs, _o: self._add("rollout", inputs)
        )
        for module in (trainer.policy.copies.unwrapped, trainer.policy.copies.compute[REFERENCE]):
            module.register_forward_hook(lambda _m, inputs, _o: self._add("training", inputs))

    def _add(self, kind: str, inputs: tuple) -> None:
        setattr(self, kind, getattr(self, kind) + int(inputs[0].shape[0]))

    def reset(self) -> None:
        self.rollout = self.training = 0


def measure(recipe: str, overrides: list[str], iterations: int, output_dir: Path) -> dict[str, float]:
    config = load_config(
        recipe,
        [*overrides, f"logging.output_dir={output_dir}", "logging.sample_every=0", "logging.progress=false"],
    )
    torch.backends.mha.set_fastpath_enabled(True)  # as in a fresh process: GRPO algorithms switch it off
    trainer = Trainer(config)
    counter = EvaluationCounter(trainer)
    images = config.images_per_step
    rows = []
    with AsyncScorer(trainer.reward) as scorer:
        for index in range(iterations + 1):
            trainer.step += 1
            counter.reset()
            start = time.perf_counter()
            row = trainer.train_step(scorer)
            seconds = time.perf_counter() - start
            if index == 0:
                continue  # warm-up
            rows.append(
                {
                    "seconds_per_iteration": seconds,
                    "rollout_seconds": row["time/rollout"],
                    "train_seconds": row["time/train"],
                    "rollout_nfe_per_image": counter.rollout / images,
                    "training_nfe": counter.training,
                    "trained_transitions": trainer.algorithm.num_rows(images, trainer.step)
                    * trainer.algorithm.passes,
                }
            )
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def run_config(run: Path, directory: Path) -> str:
    """A run's resolved config (its ``config.yaml`` minus run facts) written as a recipe under ``directory``."""
    data = yaml.safe_load((run / "config.yaml").read_text())
    for key in ("versions", "num_processes", "resume"):
        data.pop(key, None)
    path = directory / f"{run.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def reward_per_second(run: Path, seconds_per_iteration: float) -> dict[str, float]:
    rows = [row for row in read_metrics(run / "metrics.jsonl") if "reward/mean" in row]
    first, last = rows[:10], rows[-10:]
    gain = statistics.mean(r["reward/mean"] for r in last) - statistics.mean(r["reward/mean"] for r in first)
    seconds = rows[-1]["step"] * seconds_per_iteration
    summary = json.loads((run / "summary.json").read_text())
    tuned = summary.get("tuned", {}).get("1", {}).get("geneval/overall", float("nan"))
    base = summary.get("base", {}).get("1", {}).get("geneval/overall", float("nan"))
    return {
        "steps": rows[-1]["step"],
        "seconds_per_iteration": seconds_per_iteration,
        "seconds": seconds,
        "train_reward_gain": gain,
        "train_reward_gain_per_minute": 60 * gain / seconds,
        "eval_base_cfg1": base,
        "eval_tuned_cfg1": tuned,
        "eval_gain_per_minute": 60 * (tuned - base) / seconds,
    }


def plot_runs(runs: dict[Path, float], path: Path) -> None:
    """Training reward (10-step mean) against ``step x seconds per iteration`` for each run."""
    figure, axis = plt.subplots(figsize=(7, 4))
    for run, seconds_per_iteration in runs.items():
        rows = [row for row in read_metrics(run / "metrics.jsonl") if "reward/mean" in row]
        rewards = [row["reward/mean"] for row in rows]
        smooth = [statistics.mean(rewards[max(0, i - 9) : i + 1]) for i in range(len(rewards))]
        axis.plot([row["step"] * seconds_per_iteration / 60 for row in rows], smooth, label=run.name)
    axis.set_xlabel("wall-clock minutes (2 CPU cores)")
    axis.set_ylabel("training reward (10-step mean)")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--iterations", type=int, default=3, help="measured iterations per variant (after a warm-up)"
    )
    parser.add_argument("--runs", nargs="*", default=[], help="finished run directories for part 2")
    parser.add_argument("--out", default="outputs/bench_grpo.json")
    args = parser.parse_args()

    results: dict[str, dict] = {"iteration": {}, "reward_per_second": {}}
    scratch = Path(tempfile.mkdtemp(prefix="bench_grpo_"))
    timings: dict[Path, float] = {}
    try:
        for name, recipe, overrides in VARIANTS:
            results["iteration"][name] = measure(
                recipe, overrides, args.iterations, scratch / name.replace(" ", "_")
            )
        for run in map(Path, args.runs):
            recipe = run_config(run, scratch)  # timed on all cores, whatever threads the run had
            timings[run] = measure(recipe, ["training.threads=0"], 2, scratch / f"run_{run.name}")[
                "seconds_per_iteration"
            ]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    flat = results["iteration"]["flow_grpo (flat)"]["seconds_per_iteration"]
    header = ("variant", "s/iter", "vs flat", "rollout NFE/img", "trained trans.", "train NFE")
    print(f"{header[0]:<30}{header[1]:>8}{header[2]:>9}{header[3]:>17}{header[4]:>16}{header[5]:>11}")
    for name, row in results["iteration"].items():
        row["time_vs_flat"] = row["seconds_per_iteration"] / flat
        print(
            f"{name:<30}{row['seconds_per_iteration']:>8.2f}{row['time_vs_flat']:>9.2f}"
            f"{row['rollout_nfe_per_image']:>17.2f}{row['trained_transitions']:>16.0f}"
            f"{row['training_nfe']:>11.0f}"
        )
    if timings:
        header = (
            "run",
            "s/iter",
            "min",
            "reward gain",
            "gain/min",
            "eval base",
            "eval tuned",
            "eval gain/min",
        )
        print(
            f"\n{header[0]:<24}{header[1]:>7}{header[2]:>6}{header[3]:>13}{header[4]:>10}{header[5]:>11}"
            f"{header[6]:>12}{header[7]:>15}"
        )
        for run, seconds_per_iteration in timings.items():
            row = results["reward_per_second"][run.name] = reward_per_second(run, seconds_per_iteration)
            print(
                f"{run.name:<24}{row['seconds_per_iteration']:>7.2f}{row['seconds'] / 60:>6.1f}"
                f"{row['train_reward_gain']:>13.3f}{row['train_reward_gain_per_minute']:>10.4f}"
                f"{row['eval_base_cfg1']:>11.3f}{row['eval_tuned_cfg1']:>12.3f}{row['eval_gain_per_minute']:>15.4f}"
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    if timings:
        plot_runs(timings, out.with_suffix(".png"))
        print(f"reward vs wall-clock: {out.with_suffix('.png')}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
