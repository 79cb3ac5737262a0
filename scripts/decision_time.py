"""At which noise level is each task's verdict decided? Re-noise a model's own samples and denoise again.

For every held-out item (prompt + seed) the model draws ``x0`` (``S`` Euler
steps) and the verifier judges it. Then, for each level ``t``, fresh noise
puts the sample back on the straight path, ``x_t = (1 - t) x0 + t eps``
(SDEdit), the same model denoises it from ``t`` (Euler, the same step size), and
the verifier judges again. Per task and level:

- ``keep_pass``: P(right again | ``x0`` right), ``keep_fail``: P(wrong again | ``x0`` wrong);
- ``agree``: P(same verdict), and the share of the verdict that ``x_t`` still fixes,
  ``decided = (agree - chance) / (1 - chance)`` with ``chance = p^2 + (1 - p)^2`` the agreement of two
  independent draws at the task's pass rate ``p``: 1 where ``x_t`` already fixes the verdict, 0
  where the rest of the trajectory decides it alone.

Where ``decided`` falls from 1 to 0 is where the task is decided; training times far below that level
can refine a sample but not change its verdict.

    python scripts/decision_time.py --models shapes-base --out docs/task_signal/decision_time.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from flowrl.evaluation import evaluation_items
from flowrl.generate import as_policy
from flowrl.models import load_shapes_model
from flowrl.policy import TUNED, Policy
from flowrl.worlds import WORLDS
from samplers import euler, timesteps

LEVELS = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
BATCH = 64


@torch.no_grad()
def denoise(
    policy: Policy, x_t: torch.Tensor, level: float, num_steps: int, prompts: list[str]
) -> torch.Tensor:
    """Euler from ``level`` to 0 in ``max(1, round(level * num_steps))`` steps (the full run's step size)."""
    grid = timesteps(max(1, round(level * num_steps)), t_max=level)
    velocity = policy.velocity_of(TUNED)
    outputs = []
    for begin in range(0, len(prompts), BATCH):
        cond = policy.encode(prompts[begin : begin + BATCH])
        outputs.append(euler(velocity, x_t[begin : begin + BATCH], grid, cond).x0)
    return torch.cat(outputs)


def verdicts(policy: Policy, x0: torch.Tensor, items: list) -> np.ndarray:
    world = WORLDS["shapes"]
    rewards = world.verifier()(
        policy.decode(x0), [record["prompt"] for record, _ in items], [record for record, _ in items]
    )
    return rewards["strict"].numpy().astype(bool)


def verdict_persistence(first: np.ndarray, later: np.ndarray) -> dict[str, float]:
    """``keep_pass``, ``keep_fail``, ``agree`` and ``decided`` (module docstring) of the verdicts ``first``
    ``[N]`` and the verdicts ``later`` ``[N, R]`` of ``R`` re-noised copies of each sample; NaN where undefined
    (no passing or no failing sample; a pass rate of 0 or 1, where every draw agrees by chance)."""
    p = float(first.mean())
    chance = p**2 + (1 - p) ** 2
    agree = float((later == first[:, None]).mean())
    return {
        "keep_pass": float(later[first].mean()) if first.any() else float("nan"),
        "keep_fail": float((~later[~first]).mean()) if (~first).any() else float("nan"),
        "agree": agree,
        "decided": (agree - chance) / (1 - chance) if chance < 1 else float("nan"),
    }


def decision_time(
    model_name: str, images_per_task: int, num_steps: int, renoises: int, levels: tuple[float, ...]
) -> dict:
    """Per task and level: keep_pass, keep_fail, agree, decided (module docstring)."""
    world = WORLDS["shapes"]
    policy = as_policy(load_shapes_model(model_name))
    items = evaluation_items(world.prompts("test"), images_per_task, 0, world.tasks)
    prompts = [record["prompt"] for record, _ in items]
    tags = np.array([record["tag"] for record, _ in items])
    noise = policy.initial_noise([seed for _, seed in items], policy.device)
    x0 = denoise(policy, noise, 1.0, num_steps, prompts)
    first = verdicts(policy, x0, items)
    generator = torch.Generator().manual_seed(12345)
    again = {}
    for level in levels:
        rounds = []
        for _ in range(renoises):
            eps = torch.randn(x0.shape, generator=generator)
            x_t = (1 - level) * x0 + level * eps
            rounds.append(verdicts(policy, denoise(policy, x_t, level, num_steps, prompts), items))
        again[level] = np.stack(rounds, axis=1)  # [items, renoises]
    tasks = {}
    for task in world.tasks:
        rows = tags == task
        tasks[task] = {
            "pass_rate": float(first[rows].mean()),
            "levels": {str(level): verdict_persistence(first[rows], again[level][rows]) for level in levels},
        }
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["shapes-base"])
    parser.add_argument("--images-per-task", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="Euler steps of the full run")
    parser.add_argument("--renoises", type=int, default=2, help="fresh noises per item and level")
    parser.add_argument("--levels", type=float, nargs="+", default=list(LEVELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="outputs/decision_time.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results = {}
    for name in args.models:
        results[name] = decision_time(
            name, args.images_per_task, args.steps, args.renoises, tuple(args.levels)
        )
        print(f"\n{name}: share of the verdict that x_t already fixes ('decided'), per level t")
        print("task".ljust(14) + "pass" + "".join(f"{level:>7g}" for level in args.levels))
        for task, row in results[name].items():
            cells = "".join(f"{row['levels'][str(level)]['decided']:>7.2f}" for level in args.levels)
            print(f"{task:<14}{row['pass_rate']:4.2f}{cells}")
    write_results(Path(args.out), args, started, results)


def write_results(out: Path, args: argparse.Namespace, started: float, results: dict) -> None:
    """``out``: the command's arguments, its seconds since ``started``, the machine and the results."""
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "command": vars(args),
        "seconds": round(time.perf_counter() - started, 1),
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
