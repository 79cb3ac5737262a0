"""Benchmark every sampler on the shapes base model: throughput, NFE and overhead over the bare network.

For each sampler: images per second at the given batch, network evaluations
(NFE) per image, and ``time / (NFE x bare forward time at that batch)`` — how
close the sampler is to the cost of the network alone (1.0 = no overhead; CFG
doubles the rows of each call, so it shows ~2). Then a tree (BranchGRPO) and
flat Flow-SDE producing the same number of final images: NFE and wall time.

    python scripts/bench_samplers.py --out outputs/bench_samplers.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from flowrl.models import load_shapes_model
from flowrl.models.noise import seeded_noise
from flowrl.shapes.grammar import shipped_prompts
from samplers import (
    dpm_solver_2m,
    euler,
    guided_velocity,
    heun,
    meanflow_sample,
    sde_sample,
    timesteps,
    tree_sample,
)


def timed(function, repeats: int):
    """``(median wall time, last result)`` of ``function()`` over ``repeats`` runs, after one warm-up run."""
    result = function()
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations), result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="shapes-base")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree-splits", type=int, nargs="+", default=[0, 4, 8, 12])
    parser.add_argument("--branching", type=int, default=2)
    parser.add_argument("--out", default="outputs/bench_samplers.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = load_shapes_model(args.model).eval()
    prompts = [record["prompt"] for record in shipped_prompts("test")]
    prompts = (prompts * (args.batch // len(prompts) + 1))[: args.batch]
    cond = model.encode_prompts(prompts)
    uncond = model.encode_prompts([""] * args.batch)
    noise = seeded_noise(range(args.batch), (3, 32, 32))
    grid = timesteps(args.steps)

    def velocity(x, t, c):
        return model(x, t, *c)

    def average_velocity(x, r, t, c):  # the base model stands in for u(x, r, t): cost only
        return model(x, t, *c)

    with torch.no_grad():
        t_mid = torch.full((args.batch,), 0.5)
        forward, _ = timed(lambda: velocity(noise, t_mid, cond), args.repeats * 5)
        samplers = {
            "euler": lambda: euler(velocity, noise, grid, cond),
            "heun": lambda: heun(velocity, noise, grid, cond),
            "dpm_solver_2m": lambda: dpm_solver_2m(velocity, noise, grid, cond),
            "euler_cfg4.5": lambda: euler(guided_velocity(velocity, 4.5, uncond), noise, grid, cond),
            "flow_sde": lambda: sde_sample(
                velocity, noise, grid, cond, generator=torch.Generator().manual_seed(0)
            ),
            "cps_sde": lambda: sde_sample(
                velocity, noise, grid, cond, variant="cps", generator=torch.Generator().manual_seed(0)
            ),
            "meanflow_4step": lambda: meanflow_sample(average_velocity, noise, timesteps(4), cond),
        }
        rows = []
        for name, run in samplers.items():
            seconds, rollout = timed(run, args.repeats)
            nfe = rollout.nfe
            rows.append(
                {
                    "sampler": name,
                    "images_per_second": args.batch / seconds,
                    "nfe_per_image": nfe,
                    "seconds_per_batch": seconds,
                    "time_over_nfe_forwards": seconds / (nfe * forward),
                }
            )

        leaves = args.branching ** len(args.tree_splits)
        trees = max(1, args.batch // leaves)
        tree_noise = seeded_noise(range(trees), (3, 32, 32))
        tree_cond = model.encode_prompts(prompts[:trees])
        flat_noise = seeded_noise(range(trees * leaves), (3, 32, 32))
        flat_cond = model.encode_prompts([p for p in prompts[:trees] for _ in range(leaves)])
        tree_seconds, tree = timed(
            lambda: tree_sample(
                velocity,
                tree_noise,
                grid,
                tree_cond,
                args.tree_splits,
                args.branching,
                generator=torch.Generator().manual_seed(0),
            ),
            args.repeats,
        )
        flat_seconds, flat = timed(
            lambda: sde_sample(
                velocity, flat_noise, grid, flat_cond, generator=torch.Generator().manual_seed(0)
            ),
            args.repeats,
        )
    tree_row = {
        "final_images": trees * leaves,
        "trees": trees,
        "leaves_per_tree": leaves,
        "split_steps": args.tree_splits,
        "branching": args.branching,
        "tree_nfe_per_image": tree.nfe_per_tree / leaves,
        "flat_nfe_per_image": flat.nfe,
        "tree_seconds": tree_seconds,
        "flat_seconds": flat_seconds,
        "tree_over_flat_time": tree_seconds / flat_seconds,
    }

    print(
        f"bare forward at batch {args.batch}: {forward * 1000:.1f} ms   ({args.steps} steps, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    print(f"{'sampler':<16}{'images/s':>10}{'NFE/image':>11}{'s/batch':>9}{'time/(NFE x fwd)':>18}")
    for row in rows:
        print(
            f"{row['sampler']:<16}{row['images_per_second']:>10.1f}{row['nfe_per_image']:>11}"
            f"{row['seconds_per_batch']:>9.2f}{row['time_over_nfe_forwards']:>18.2f}"
        )
    print(
        f"\ntree vs flat SDE, {tree_row['final_images']} final images ({trees} trees x {leaves} leaves, splits at "
        f"{args.tree_splits}): NFE/image {tree_row['tree_nfe_per_image']:.2f} vs {args.steps}, "
        f"wall time {tree_seconds:.2f}s vs {flat_seconds:.2f}s (ratio {tree_row['tree_over_flat_time']:.2f})"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "batch": args.batch,
                "steps": args.steps,
                "threads": torch.get_num_threads(),
                "forward_seconds": forward,
                "samplers": rows,
                "tree_vs_flat": tree_row,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
