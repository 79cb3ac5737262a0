"""The learning benchmark: recipes x seeds at equal image budgets, beside the baselines anyone would try first.

    python scripts/bench_learning.py --suite main          # configs/bench/main.yaml: about an hour here
    python scripts/bench_learning.py --suite smoke --out /tmp/bench_smoke   # 1 seed, 1 step (the CI test)
    python scripts/bench_learning.py --suite main --summarise-only         # tables and plots of what is done

A suite (``configs/bench/<name>.yaml``) names recipes, seeds, the image budget of every run and how often
the held-out evaluation runs. Every run is ``flowrl train <recipe> training.seed=<s>
training.steps=<images / images per step>`` in its own process, one after the other (never two CPU-bound
jobs at once), into ``<out>/runs/<recipe>/seed<s>/``, checkpointed at every evaluation so that an
interrupted benchmark resumes: finished runs are read, not run again, and a cut-short run continues from its
last checkpoint. The baselines, per base model (cached in ``<out>/baselines/``):

- the base with and without CFG (the held-out evaluation the runs use, seed 0);
- best-of-N with the verifier: ``max(best_of)`` rounds of the CFG-free evaluation with disjoint seeds
  (round ``k`` uses seed ``k * 1_000_003``; round 0 is the base's own evaluation); per evaluation item the
  sample with the highest training reward (the verifier's partial score) is kept and scored strictly.
  Its cost per image is ``N`` generations and ``N`` verifier calls: NFE ``N x num_steps`` and the
  measured generation seconds per image (the verifier's time, small here, is not counted);
- RAFT (``configs/shapes_raft.yaml``) is one of the suite's recipes, trained like the others.

Then :mod:`learning_report` writes ``<out>/bench_learning.json``, ``<out>/bench_learning.md`` and the PNGs
(held-out score against images and against training seconds with mean ± sd bands, training reward,
per-task scores) and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from bench_suite import SUITES, Recipe, Suite, resolve
from headroom import ROUND_SEED_STRIDE
from learning_report import write_report
from tqdm.auto import tqdm

from flowrl.evaluation import evaluate, geneval_scores
from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.worlds import World, world_of_model


def finished(directory: Path) -> bool:
    summary = directory / "summary.json"
    return summary.is_file() and "tuned" in json.loads(summary.read_text())


def train(recipe: Recipe, seed: int, suite: Suite, out: Path) -> None:
    """One run in its own process; continues from the run's last checkpoint when it has one."""
    directory = recipe.run_dir(out, seed)
    resumable = (directory / "checkpoints" / "latest").is_file()
    if directory.exists() and not resumable:
        shutil.rmtree(directory)  # cut short before its first checkpoint: start it again
    command = [
        sys.executable,
        *("-m", "flowrl.train", recipe.path),
        *suite.overrides,
        f"training.seed={seed}",
        f"training.steps={recipe.steps}",
        f"logging.output_dir={directory}",
        "logging.progress=false",
        "logging.sample_every=0",
        f"logging.checkpoint_every={recipe.eval_every}",
        f"evaluation.every={recipe.eval_every}",
        "evaluation.base_guidance_scales=[]",
        "evaluation.guidance_scales=[1.0]",
        f"evaluation.images_per_task={suite.eval_images_per_task}",
        f"evaluation.num_steps={recipe.eval_num_steps}",
        *(["resume=latest"] if resumable else []),
    ]
    log = directory.parent / f"seed{seed}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as stream:
        result = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT)
    if result.returncode:
        raise SystemExit(f"{recipe.name} seed {seed} failed (exit {result.returncode}); its output: {log}")


def scores_of(
    world: World, items: list, strict: torch.Tensor, partial_scores: torch.Tensor
) -> dict[str, float]:
    return geneval_scores([record["tag"] for record, _ in items], strict, partial_scores, world)


def base_baselines(model_name: str, recipe: Recipe, suite: Suite, out: Path) -> dict[str, Any]:
    """The base at each guidance scale and best-of-N CFG-free; cached in ``<out>/baselines/``."""
    path = out / "baselines" / f"{Path(model_name).name}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        wanted = {f"{scale:g}" for scale in suite.base_guidance_scales}
        if wanted <= set(cached["cfg"]) and {str(n) for n in suite.best_of} <= set(cached["best_of"]):
            return cached
    model = load_shapes_model(model_name)
    world = world_of_model(model.is_video, model.config.image_condition)
    generation_seconds = [0.0]

    def sampler(*arguments: Any, **keywords: Any) -> torch.Tensor:  # the base's generate, timed
        start = time.perf_counter()
        media = generate(model, *arguments, **keywords)
        generation_seconds[0] += time.perf_counter() - start
        return media

    records = world.prompts("test")
    per_task, num_steps = suite.eval_images_per_task, recipe.eval_num_steps
    result: dict[str, Any] = {"model": model_name, "num_steps": num_steps, "cfg": {}, "best_of": {}}
    rounds = max(suite.best_of, default=0)
    strict, partial_scores, seconds, items = [], [], [], []
    for round_index in tqdm(range(rounds), desc=f"best-of-{rounds} {model_name}", unit="round"):
        generation_seconds[0] = 0.0
        scores, _, items, rewards = evaluate(
            sampler, records, per_task, num_steps, 1.0, seed=round_index * ROUND_SEED_STRIDE, world=world
        )
        seconds.append(generation_seconds[0])
        strict.append(rewards["strict"].float())
        partial_scores.append(rewards["partial"].float())
        if round_index == 0:  # round 0 is the CFG-free evaluation of the base
            result["cfg"]["1"] = scores
    for scale in suite.base_guidance_scales:
        if f"{scale:g}" not in result["cfg"]:
            result["cfg"][f"{scale:g}"], *_ = evaluate(
                sampler, records, per_task, num_steps, scale, world=world
            )
    for n in suite.best_of:
        chosen = torch.stack(partial_scores[:n], dim=1).argmax(dim=1)  # the first best among equal scores
        rows = torch.arange(len(items))
        picked_strict = torch.stack(strict[:n], dim=1)[rows, chosen]
        picked_partial = torch.stack(partial_scores[:n], dim=1)[rows, chosen]
        scores = scores_of(world, items, picked_strict, picked_partial)
        result["best_of"][str(n)] = {
            **scores,
            "nfe_per_image": n * num_steps,
            "generation_seconds_per_image": sum(seconds[:n]) / len(items),
            "pass_at_n": float(torch.stack(strict[:n], dim=1).max(dim=1).values.mean()),
        }
    result["generation_seconds_per_image"] = seconds[0] / len(items) if seconds else None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", default="main", help=f"a suite of {SUITES}/ (name or .yaml path)")
    parser.add_argument("--out", default=None, help="output folder (default: runs/bench_<suite>)")
    parser.add_argument("--recipes", nargs="+", default=None, help="only these recipes of the suite")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="only these seeds")
    parser.add_argument("--summarise-only", action="store_true", help="only read what is finished")
    args = parser.parse_args()
    suite_path = Path(args.suite) if args.suite.endswith(".yaml") else SUITES / f"{args.suite}.yaml"
    if not suite_path.is_file():
        known = sorted(path.stem for path in SUITES.glob("*.yaml"))
        raise SystemExit(f"suite {args.suite!r} is not allowed; use one of {known} or a .yaml path")
    suite = Suite.load(suite_path)
    if args.recipes:
        unknown = sorted(set(args.recipes) - set(suite.recipes))
        if unknown:
            raise SystemExit(f"--recipes {unknown} are not in the suite; it has {list(suite.recipes)}")
        suite.recipes = {name: suite.recipes[name] for name in args.recipes}
    suite.seeds = args.seeds or suite.seeds
    out = Path(args.out or f"runs/bench_{suite_path.stem}")
    out.mkdir(parents=True, exist_ok=True)
    recipes = {name: resolve(suite, name) for name in suite.recipes}  # every recipe checked before any run

    baselines: dict[str, Any] = {}
    for recipe in recipes.values():
        if recipe.base_model not in baselines and not args.summarise_only:
            tqdm.write(f"[{time.strftime('%H:%M:%S')}] baselines of {recipe.base_model}")
            baselines[recipe.base_model] = base_baselines(recipe.base_model, recipe, suite, out)
    if not args.summarise_only:
        todo = [(seed, recipe) for seed in suite.seeds for recipe in recipes.values()]
        # seed by seed: a cut-short benchmark still covers every recipe
        for seed, recipe in tqdm(todo, desc="runs", unit="run"):
            if finished(recipe.run_dir(out, seed)):
                continue
            start = time.perf_counter()
            tqdm.write(f"[{time.strftime('%H:%M:%S')}] {recipe.name} seed {seed}: {recipe.steps} steps")
            train(recipe, seed, suite, out)
            tqdm.write(f"    done in {time.perf_counter() - start:.0f} s")
    for recipe in recipes.values():
        cached = out / "baselines" / f"{Path(recipe.base_model).name}.json"
        if recipe.base_model not in baselines and cached.is_file():
            baselines[recipe.base_model] = json.loads(cached.read_text())
    command = " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
    previous = out / "bench_learning.json"
    if args.summarise_only and previous.is_file():  # the command that ran the benchmark, not this one
        command = json.loads(previous.read_text()).get("command", command)
    write_report(out, suite_path.stem, suite, recipes, baselines, command)


if __name__ == "__main__":
    main()
