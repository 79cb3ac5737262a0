"""Two video models side by side on the same prompts and initial noise: one animated GIF whose rows are
prompts and whose columns alternate the models (CFG-free Euler, as the evaluation samples).

    python scripts/video_before_after.py --models shapes-video shapes-video-v2 --out docs/video_base_before_after.gif
"""

from __future__ import annotations

import argparse

import torch

from flowrl.generate import generate
from flowrl.grid import save_grid
from flowrl.models import load_shapes_model

#: held-out prompts (the test split) of the three motion tasks
PROMPTS = (
    "a green circle moving right",
    "a blue circle moving down",
    "a circle moving left quickly",
    "a triangle moving up quickly",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs=2, default=["shapes-video", "shapes-video-v2"], metavar=("BEFORE", "AFTER")
    )
    parser.add_argument("--prompts", nargs="+", default=list(PROMPTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="outputs/video_before_after.gif")
    args = parser.parse_args()
    prompts = [prompt for prompt in args.prompts for _ in args.seeds]
    seeds = [seed for _ in args.prompts for seed in args.seeds]
    clips = [generate(load_shapes_model(name), prompts, seeds, args.steps, 1.0) for name in args.models]
    # per prompt and seed: the first model's clip, then the second's
    media = torch.stack(clips, dim=1).flatten(0, 1)
    captions = [f"{name}: {prompt} ({seed})" for prompt, seed in zip(prompts, seeds) for name in args.models]
    print(f"wrote {save_grid(args.out, media, captions, columns=2 * len(args.seeds))}")


if __name__ == "__main__":
    main()
