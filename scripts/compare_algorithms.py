"""Train each algorithm's shapes recipe over several seeds at the main job's budget and compare them.

    python scripts/compare_algorithms.py                      # all recipes x seeds 0 1 2 (about 1.5 h here)
    python scripts/compare_algorithms.py --seeds 0 --recipes nft flow_grpo

Every run is ``flowrl train configs/<recipe>.yaml training.seed=<s>`` (120 steps of 64 images), one after
the other (never two CPU-bound runs at once), into ``<out>/<recipe>_seed<s>/``; a run whose
``summary.json`` holds a tuned score is not run again, so an interrupted comparison resumes. The base is
evaluated once per base model (seed 0; CFG-free and CFG 3). Then per algorithm, mean and sd over seeds:
the training reward of the first and the last 20 steps, its rise in units of the seed spread, and the
held-out CFG-free score against the base. Prints the table, writes ``<out>/comparison.json`` and a bar
chart ``<out>/comparison.png`` (and the table as ``<out>/comparison.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: recipe -> config file (the algorithm's shapes recipe)
RECIPES = {
    "nft": "configs/shapes_nft.yaml",
    "flow_grpo": "configs/shapes_flowgrpo.yaml",
    "branch_grpo": "configs/shapes_branchgrpo.yaml",
    "crd": "configs/shapes_crd.yaml",
    "meanflow_nft": "configs/shapes_meanflownft.yaml",
    "branch_grpo_mix": "configs/shapes_branchgrpo_mix.yaml",
}
WINDOW = 20  # steps averaged at the start and the end of training


def run_dir(out: Path, recipe: str, seed: int) -> Path:
    return out / f"{recipe}_seed{seed}"


def finished(directory: Path) -> bool:
    summary = directory / "summary.json"
    return summary.is_file() and "tuned" in json.loads(summary.read_text())


def train(recipe: str, seed: int, out: Path, extra: list[str]) -> None:
    directory = run_dir(out, recipe, seed)
    base = "[1.0, 3.0]" if seed == 0 else "[]"
    command = [
        sys.executable,
        "-m",
        "flowrl.train",
        RECIPES[recipe],
        f"training.seed={seed}",
        f"logging.output_dir={directory}",
        "resume=latest",  # an unfinished run of an interrupted comparison is started again in its folder
        "logging.progress=false",
        "logging.checkpoint_every=0",
        "evaluation.every=0",
        f"evaluation.base_guidance_scales={base}",
        *extra,
    ]
    start = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] {recipe} seed {seed}: {' '.join(command[3:])}", flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"    done in {time.perf_counter() - start:.0f} s", flush=True)


def read_run(directory: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    rewards = [row["reward/mean"] for row in rows if row.get("step", 0) > 0 and "reward/mean" in row]
    summary = json.loads((directory / "summary.json").read_text())
    overall = next(key for key in summary["tuned"]["1"] if key.endswith("/overall"))
    step_times = [row["time/step"] for row in rows if "time/step" in row]
    return {
        "reward_first": statistics.mean(rewards[:WINDOW]),
        "reward_last": statistics.mean(rewards[-WINDOW:]),
        "held_out": summary["tuned"]["1"][overall],
        "drift": summary["tuned"]["1"].get("drift/colour_tv", float("nan")),
        "base_cfg1": summary["base"].get("1", {}).get(overall, float("nan")),
        "base_cfg3": summary["base"].get("3", {}).get(overall, float("nan")),
        "seconds_per_step": statistics.median(step_times),
    }


def mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def summarise(out: Path, recipes: list[str], seeds: list[int]) -> dict[str, dict]:
    table = {}
    for recipe in recipes:
        runs = {
            seed: read_run(run_dir(out, recipe, seed))
            for seed in seeds
            if finished(run_dir(out, recipe, seed))
        }
        if not runs:
            continue
        seed0 = runs.get(0, next(iter(runs.values())))
        rise = [run["reward_last"] - run["reward_first"] for run in runs.values()]
        first_sd = mean_sd([run["reward_first"] for run in runs.values()])[1]
        table[recipe] = {
            "seeds": sorted(runs),
            "runs": runs,
            "reward_first": mean_sd([run["reward_first"] for run in runs.values()]),
            "reward_last": mean_sd([run["reward_last"] for run in runs.values()]),
            "reward_rise": mean_sd(rise),
            "rise_over_seed_sd": statistics.mean(rise) / first_sd
            if first_sd and first_sd == first_sd
            else None,
            "held_out": mean_sd([run["held_out"] for run in runs.values()]),
            "base_cfg1": seed0["base_cfg1"],
            "base_cfg3": seed0["base_cfg3"],
            "seconds_per_step": mean_sd([run["seconds_per_step"] for run in runs.values()]),
        }
    return table


def print_table(table: dict[str, dict]) -> None:
    print(
        f"{'algorithm':<16}{'seeds':>6}{'reward first 20':>18}{'reward last 20':>18}{'rise/sd':>9}"
        f"{'held-out cfg1':>16}{'base cfg1':>11}{'s/step':>8}"
    )
    for recipe, row in table.items():
        cells = [
            f"{row[key][0]:.3f}±{row[key][1]:.3f}" for key in ("reward_first", "reward_last", "held_out")
        ]
        rise = "n/a" if row["rise_over_seed_sd"] is None else f"{row['rise_over_seed_sd']:.1f}"
        print(
            f"{recipe:<16}{len(row['seeds']):>6}{cells[0]:>18}{cells[1]:>18}{rise:>9}{cells[2]:>16}"
            f"{row['base_cfg1']:>11.3f}{row['seconds_per_step'][0]:>8.2f}"
        )


def markdown(table: dict[str, dict]) -> str:
    """The table as Markdown (mean ± sd over seeds)."""
    lines = [
        "| algorithm | seeds | training reward, first 20 steps | last 20 steps | rise / seed sd | held-out CFG-free "
        "| base CFG-free | base CFG 3 | s/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for recipe, row in table.items():
        cells = [
            f"{row[key][0]:.3f} ± {row[key][1]:.3f}" for key in ("reward_first", "reward_last", "held_out")
        ]
        rise = "n/a" if row["rise_over_seed_sd"] is None else f"{row['rise_over_seed_sd']:.1f}"
        lines.append(
            f"| {recipe} | {len(row['seeds'])} | {cells[0]} | {cells[1]} | {rise} | {cells[2]} | "
            f"{row['base_cfg1']:.3f} | {row['base_cfg3']:.3f} | {row['seconds_per_step'][0]:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(table: dict[str, dict], path: Path) -> None:
    names = list(table)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, title in (
        (axes[0], "reward_last", "training reward, last 20 steps"),
        (axes[1], "held_out", "held-out CFG-free score"),
    ):
        means = [table[name][key][0] for name in names]
        sds = [0.0 if table[name][key][1] != table[name][key][1] else table[name][key][1] for name in names]
        axis.bar(names, means, yerr=sds, capsize=4, color="#4c72b0")
        if key == "held_out":
            for name_index, name in enumerate(names):
                axis.hlines(
                    table[name]["base_cfg1"], name_index - 0.4, name_index + 0.4, colors="k", linestyles="--"
                )
        else:
            axis.scatter(
                names, [table[name]["reward_first"][0] for name in names], color="k", marker="_", s=300
            )
        axis.set_title(title + " (mean ± sd over seeds)")
        axis.tick_params(axis="x", rotation=30)
    axes[1].set_ylabel("dashed: base CFG-free")
    axes[0].set_ylabel("bars: last 20 steps; ticks: first 20")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/compare_algorithms")
    parser.add_argument("--summarise-only", action="store_true", help="only read the finished runs")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summarise_only:
        for seed in args.seeds:  # seed by seed: a cut-short comparison still covers every algorithm
            for recipe in args.recipes:
                if not finished(run_dir(out, recipe, seed)):
                    train(recipe, seed, out, args.overrides)
    table = summarise(out, args.recipes, args.seeds)
    print_table(table)
    (out / "comparison.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "comparison.md").write_text(markdown(table))
    plot(table, out / "comparison.png")
    print(f"wrote {out / 'comparison.json'} and {out / 'comparison.png'}")


if __name__ == "__main__":
    main()
