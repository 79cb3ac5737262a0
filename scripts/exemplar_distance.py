"""How far are a model's samples from an exemplar set? The ``exemplar_fd`` reward's distance on held-out prompts.

For each model, one CFG-free sample per held-out prompt slot (``--images-per-task`` per task, the held-out
evaluation's prompts and seeds, 20 Euler steps), then the Fréchet distance of the whole set's
``pooled_pixels`` features to the exemplar set (``rewards/exemplar_fd.py``) and the verifier's score of the
same images. A set of a few hundred images says more than a training micro-batch of 32: FD's bias shrinks
with the set's size, so compare models only at equal ``--images-per-task``.

    python scripts/exemplar_distance.py --models shapes-base-v2 runs/pilots/dragon_fd/model --out runs/exemplar_distance.json
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

from flowrl.evaluation import evaluate
from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.worlds import get_world
from rewards.exemplar_fd import ExemplarFD, pooled_pixels


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--models", nargs="+", required=True, help="shipped shapes model names or model folders"
    )
    parser.add_argument("--images-per-task", type=int, default=64)
    parser.add_argument("--exemplars", default="shapes")
    parser.add_argument("--grid", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args()
    world = get_world("shapes")
    reward = ExemplarFD(args.exemplars, args.grid)
    rows = []
    for name in args.models:
        model = load_shapes_model(name)
        scores, images, _, _ = evaluate(
            partial(generate, model), world.prompts("test"), args.images_per_task, 20, 1.0, world=world
        )
        distance = reward.distance(pooled_pixels(images, args.grid))
        rows.append(
            {
                "model": name,
                "images": len(images),
                "distance": distance,
                "held_out": scores["geneval/overall"],
            }
        )
        print(
            f"{name}: distance {distance:.4f} over {len(images)} images, held-out {scores['geneval/overall']:.3f}"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"exemplars": args.exemplars, "grid": args.grid, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
