"""Render the shipped exemplar set of the ``exemplar_fd`` reward: one image per training prompt of a world.

    python scripts/make_exemplars.py                  # rewards/assets/shapes_exemplars.npz (the 364 training prompts, seed 0)

The renders are the world's ground truth (the pretraining data's renderer), laid out by
``np.random.default_rng(seed)``; the prompts are the training split in a fixed shuffle (its first ``count`` with ``--count``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from flowrl.worlds import get_world


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world", default="shapes", choices=["shapes"])
    parser.add_argument("--count", type=int, default=None, help="renders (default: every training prompt)")
    parser.add_argument("--size", type=int, default=32, help="image size in pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("rewards/assets/shapes_exemplars.npz"))
    args = parser.parse_args()
    world = get_world(args.world)
    records = world.prompts("train")
    rng = np.random.default_rng(args.seed)
    chosen = rng.permutation(len(records))[: args.count]
    images = np.stack([world.render(records[i], rng, (3, args.size, args.size)) for i in chosen])
    pixels = (images * 255).round().astype(np.uint8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, images=pixels, prompts=np.array([records[i]["prompt"] for i in chosen]))
    print(
        f"{args.out}: {len(pixels)} renders of {args.world} training prompts, {args.out.stat().st_size / 1e3:.0f} kB"
    )


if __name__ == "__main__":
    main()
