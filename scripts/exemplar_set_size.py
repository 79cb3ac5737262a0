"""How large must a scored set be for ``exemplar_fd``'s contributions to rank samples as the whole distribution would?

DRAGON ranks each group's samples by their contribution to the scored set's Fréchet distance to the exemplars,
``FD(S without i) - FD(S)``. What a run should lower is the distance of the model's whole distribution, so
the ranking that matters is each sample's contribution to a large population ``P`` of the model's samples.
A small set's own mean and covariance are mostly those of the few prompts it holds, so its ranking can
disagree. This script samples ``--prompts`` training prompts x ``--group`` images from a model, takes all of
them as ``P``, cuts ``P`` into sets of each ``--set-sizes`` (whole groups, in order), and reports the mean
within-group Spearman correlation between the set-level and the population-level contributions:

    python scripts/exemplar_set_size.py --model shapes-base-v2 --out runs/exemplar_set_size.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.worlds import get_world
from rewards.exemplar_fd import ExemplarFD, pooled_pixels


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="shapes-base-v2", help="a shipped shapes model or a model folder")
    parser.add_argument("--prompts", type=int, default=64, help="training prompts sampled (the population)")
    parser.add_argument("--group", type=int, default=8, help="images per prompt (a DRAGON group)")
    parser.add_argument("--set-sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--num-steps", type=int, default=10, help="Euler steps (the recipe's rollouts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args()
    population = args.prompts * args.group
    bad = [size for size in args.set_sizes if size % args.group or population % size or size < 3]
    if bad:
        raise SystemExit(
            f"--set-sizes {bad} are not allowed: each must be a multiple of --group ({args.group}), at least 3, "
            f"and divide the population ({population})"
        )
    records = get_world("shapes").prompts("train")
    chosen = np.random.default_rng(args.seed).choice(len(records), args.prompts, replace=False)
    prompts = [records[i]["prompt"] for i in chosen for _ in range(args.group)]
    with torch.no_grad():
        images = generate(load_shapes_model(args.model), prompts, list(range(population)), args.num_steps)
    reward = ExemplarFD("shapes")

    def contributions(begin: int, end: int) -> np.ndarray:
        """The reward's own score of ``images[begin:end]`` scored as one set."""
        return reward(images[begin:end], prompts[begin:end], [{}] * (end - begin))["contribution"].numpy()

    overall = contributions(0, population)
    rows = []
    for size in args.set_sizes:
        correlations = []
        for begin in range(0, population, size):
            scored = contributions(begin, begin + size)
            for start in range(0, size, args.group):
                group = slice(start, start + args.group)
                truth = overall[begin + start : begin + start + args.group]
                correlations.append(spearmanr(scored[group], truth).statistic)
        rows.append({"set_size": size, "spearman": float(np.mean(correlations)), "groups": len(correlations)})
        print(
            f"sets of {size:4d}: within-group Spearman with the population's ranking {rows[-1]['spearman']:.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        distance = reward.distance(pooled_pixels(images, reward.grid))
        summary = {"model": args.model, "population": population, "distance": distance}
        args.out.write_text(json.dumps({**summary, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
