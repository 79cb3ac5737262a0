"""The sanity ladder: does each algorithm raise rewards that any correct implementation raises quickly?

    python scripts/sanity_ladder.py                                  # every algorithm x rung x seeds 0, 1, 2
    python scripts/sanity_ladder.py --rungs brightness jpeg --seeds 0 --algorithms flow_grpo crd
    python scripts/sanity_ladder.py --summarise-only                 # tables and plot of what is done

Rungs, easiest first: mean **brightness** (``rewards/brightness.py``: every sample of a group scores
differently, the reward is smooth in the pixels), **JPEG** compressibility (DDPO's first reward) and the
shapes **verifier** (the task the learning benchmark measures). An algorithm that fails the first rung has a
wrong sign, a detached gradient or a zero advantage; one that climbs the first two but not the verifier has
a signal, not a bug, problem. ``tests/test_sanity_ladder.py`` runs the first rung on a tiny model for every
algorithm in CI, and checks that it fails with the reward's sign flipped.

Every run is ``flowrl train <recipe> rewards=<rung> training.steps=<rung steps> training.seed=<s>`` on the
shipped base, in its own process, one after the other (never two CPU-bound jobs at once), into
``<out>/runs/<rung>/<algorithm>/seed<s>/``; a finished run is read, not run again. The base evaluation is
skipped and the final one is small: the ladder reads the *training* reward of the rung's raw component
(``reward/<name>`` in ``metrics.jsonl``). Per run::

    rise  = mean(last quarter of steps) - mean(first quarter)
    noise = sd(first quarter) / sqrt(its steps)              the standard error of the first quarter's mean

A cell (algorithm, rung) **climbs** when every seed rises and the mean rise is at least ``Z_CLIMBS`` times
the mean noise. Writes ``<out>/ladder.json``, ``<out>/ladder.md`` and ``<out>/ladder.png`` (the training
reward of every algorithm per rung, mean over seeds) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the shapes recipe of every algorithm, as the learning benchmark's main suite names them
RECIPES: dict[str, str] = {
    "nft": "configs/shapes_nft.yaml",
    "flow_grpo": "configs/shapes_flowgrpo.yaml",
    "branch_grpo": "configs/shapes_branchgrpo.yaml",
    "branch_grpo_mix": "configs/shapes_branchgrpo_mix.yaml",
    "crd": "configs/shapes_crd.yaml",
    "raft": "configs/shapes_raft.yaml",
    "meanflow_nft": "configs/shapes_meanflownft.yaml",
    "fpo": "configs/shapes_fpo.yaml",
    "prdp": "configs/shapes_prdp.yaml",
    "dragon": "configs/shapes_dragon.yaml",
    "tagrpo": "configs/shapes_tagrpo.yaml",
}

#: algorithms that use no reward (SePPO learns from rendered winners and earlier checkpoints' samples): no
#: reward ladder applies; their rung is in their tests (tests/test_seppo.py: the error on held-out winners
#: falls, and rises with the preference inverted)
REWARD_FREE = ("seppo",)

#: recipe settings in the verifier's units, dropped on the other rungs (RAFT fits only samples the verifier
#: passes in full: on brightness no sample reaches 1)
VERIFIER_UNITS = {"raft": ["algorithm.min_reward=null"]}

#: a cell climbs when the mean rise over seeds is at least this many standard errors of the start
Z_CLIMBS = 3.0


@dataclass(frozen=True)
class Rung:
    """One reward of the ladder: the ``rewards`` override, the logged raw component and the run length."""

    name: str
    reward: str
    steps: int

    @property
    def key(self) -> str:
        return f"reward/{self.reward}"

    @property
    def override(self) -> str:
        return f"rewards={{{self.reward}: 1.0}}"


RUNGS = {
    rung.name: rung
    for rung in (
        Rung("brightness", "brightness", 20),
        Rung("jpeg", "jpeg_compressibility", 30),
        Rung("verifier", "shapes_verifier", 60),
    )
}


def rung_curve(metrics_path: Path, key: str) -> list[float]:
    """The training reward ``key`` of every step of a run, in step order."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return [row[key] for row in sorted(rows, key=lambda row: row["step"]) if key in row]


def rise_and_noise(curve: list[float]) -> tuple[float, float]:
    """``(rise, noise)`` of the module docstring; a quarter is at least 2 steps."""
    if len(curve) < 4:
        raise ValueError(f"a ladder run needs at least 4 steps, got {len(curve)}")
    quarter = max(2, len(curve) // 4)
    first, last = curve[:quarter], curve[-quarter:]
    rise = statistics.fmean(last) - statistics.fmean(first)
    return rise, statistics.stdev(first) / len(first) ** 0.5


def verdict(rises: list[float], noises: list[float]) -> str:
    """``climbs``, ``falls`` (the mirror criterion: a sign error) or ``flat``."""
    mean_rise, mean_noise = statistics.fmean(rises), statistics.fmean(noises)
    if all(r > 0 for r in rises) and mean_rise >= Z_CLIMBS * mean_noise:
        return "climbs"
    if all(r < 0 for r in rises) and -mean_rise >= Z_CLIMBS * mean_noise:
        return "falls"
    return "flat"


def run_dir(out: Path, rung: str, algorithm: str, seed: int) -> Path:
    return out / "runs" / rung / algorithm / f"seed{seed}"


def train(out: Path, rung: Rung, algorithm: str, seed: int) -> str:
    """One ladder run in its own process, unless it finished before (its ``summary.json`` has a tuned score);
    returns what happened, for the progress line."""
    directory = run_dir(out, rung.name, algorithm, seed)
    summary = directory / "summary.json"
    if summary.is_file() and "tuned" in json.loads(summary.read_text()):
        return "done before"
    resume = ["resume=latest"] if (directory / "checkpoints" / "latest").is_file() else []
    if directory.exists() and not resume:  # started but never checkpointed: start again
        shutil.rmtree(directory)
    command = [
        sys.executable,
        "-m",
        "flowrl.train",
        RECIPES[algorithm],
        rung.override,
        *(VERIFIER_UNITS.get(algorithm, []) if rung.reward != "shapes_verifier" else []),
        f"training.steps={rung.steps}",
        f"training.seed={seed}",
        "evaluation.every=0",
        "evaluation.base_guidance_scales=[]",
        "evaluation.images_per_task=8",
        "logging.sample_every=0",
        f"logging.checkpoint_every={max(1, rung.steps // 4)}",
        "logging.progress=false",
        f"logging.output_dir={directory}",
        *resume,
    ]
    start = time.perf_counter()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"ladder run {rung.name}/{algorithm}/seed{seed} failed:\n{result.stderr[-3000:]}")
    return f"{time.perf_counter() - start:.0f} s"


def summarise(out: Path, rungs: list[str], algorithms: list[str], seeds: list[int]) -> dict:
    """Every finished run's curve, rise and noise, and each cell's verdict."""
    cells: dict[str, dict] = {}
    for name in rungs:
        rung = RUNGS[name]
        for algorithm in algorithms:
            runs = {}
            for seed in seeds:
                metrics = run_dir(out, name, algorithm, seed) / "metrics.jsonl"
                if metrics.is_file():
                    curve = rung_curve(metrics, rung.key)
                    if len(curve) >= rung.steps:
                        rise, noise = rise_and_noise(curve)
                        runs[seed] = {"curve": curve, "rise": rise, "noise": noise}
            if not runs:
                continue
            rises = [run["rise"] for run in runs.values()]
            noises = [run["noise"] for run in runs.values()]
            cells[f"{name}/{algorithm}"] = {
                "rung": name,
                "algorithm": algorithm,
                "reward": rung.key,
                "steps": rung.steps,
                "seeds": sorted(runs),
                "rise_mean": statistics.fmean(rises),
                "rise_sd": statistics.stdev(rises) if len(rises) > 1 else 0.0,
                "noise_mean": statistics.fmean(noises),
                "verdict": verdict(rises, noises),
                "runs": runs,
            }
    return cells


def markdown(cells: dict) -> str:
    lines = [
        "| rung | algorithm | seeds | rise (last - first quarter) | start noise (s.e.) | rise / noise | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell in cells.values():
        ratio = cell["rise_mean"] / cell["noise_mean"] if cell["noise_mean"] > 0 else float("inf")
        lines.append(
            f"| {cell['rung']} | {cell['algorithm']} | {len(cell['seeds'])} | "
            f"{cell['rise_mean']:+.4f} ± {cell['rise_sd']:.4f} | {cell['noise_mean']:.4f} | {ratio:+.1f} | "
            f"{cell['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def plot(cells: dict, path: Path) -> None:
    """One panel per rung: each algorithm's training reward (mean over seeds) against steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rungs = list(dict.fromkeys(cell["rung"] for cell in cells.values()))
    figure, axes = plt.subplots(1, len(rungs), figsize=(5 * len(rungs), 3.8), squeeze=False)
    for axis, name in zip(axes[0], rungs):
        for cell in (cell for cell in cells.values() if cell["rung"] == name):
            curves = [run["curve"] for run in cell["runs"].values()]
            length = min(len(curve) for curve in curves)
            mean = [statistics.fmean(curve[i] for curve in curves) for i in range(length)]
            axis.plot(range(1, length + 1), mean, label=f"{cell['algorithm']} ({cell['verdict']})")
        axis.set_title(f"{name} ({RUNGS[name].key})")
        axis.set_xlabel("training step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    axes[0][0].set_ylabel("training reward (mean over seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rungs", nargs="+", choices=list(RUNGS), default=list(RUNGS))
    parser.add_argument("--algorithms", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/sanity_ladder"))
    parser.add_argument("--summarise-only", action="store_true", help="report the finished runs, train none")
    args = parser.parse_args(argv)
    if not args.summarise_only:
        todo = [(r, a, s) for r in args.rungs for a in args.algorithms for s in args.seeds]
        for index, (rung, algorithm, seed) in enumerate(todo, 1):
            outcome = train(args.out, RUNGS[rung], algorithm, seed)
            print(f"[{index}/{len(todo)}] {rung:10s} {algorithm:16s} seed {seed}: {outcome}", flush=True)
    cells = summarise(args.out, args.rungs, args.algorithms, args.seeds)
    if not cells:
        raise SystemExit(f"no finished ladder runs under {args.out}/runs")
    table = markdown(cells)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ladder.md").write_text(table)
    (args.out / "ladder.json").write_text(json.dumps(cells, indent=1) + "\n")
    plot(cells, args.out / "ladder.png")
    print(table)


if __name__ == "__main__":
    main()
