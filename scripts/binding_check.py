"""Does a shapes model bind words to objects? Two measurements of the conditioning.

1. **Clauses** (what the verifier sees): on the held-out prompts of position
   and colour attribution, the share of images with the right objects (each
   named shape exactly once), and among those, the share whose relation
   (position) or colours (colour attribution) are also right. A model that
   cannot tell which object a word belongs to draws the right objects and
   then gets the relation or the colours right by symmetry, about half the time.
2. **Sensitivity** (what the network sees): the change of the model's velocity
   at the same ``x_t`` and ``t`` when a prompt's binding is swapped, relative
   to a change of its words::

       ratio = rms(v(x, t, P) - v(x, t, swap(P))) / rms(v(x, t, P) - v(x, t, other(P)))

   e.g. ``P`` "a red circle and a blue square", ``swap(P)`` "a blue circle and
   a red square" (same words, other binding), ``other(P)`` "a green circle and
   a yellow square". Near 0: the prompt reaches the image as a bag of words.

    python scripts/binding_check.py --models shapes-base runs/main/model --out docs/task_signal/binding.json
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from flowrl.evaluation import evaluate
from flowrl.generate import generate
from flowrl.models import load_shapes_model
from flowrl.models.shapes_dit import ShapesDiT
from flowrl.worlds import WORLDS
from rewards.shapes_verifier import detect_objects, entry_checks

#: (name, prompt, the prompt with its binding swapped, the prompt with other words)
SWAPS = (
    (
        "colours swapped",
        "a red circle and a blue square",
        "a blue circle and a red square",
        "a green circle and a yellow square",
    ),
    (
        "subject swapped",
        "a circle left of a square",
        "a square left of a circle",
        "a triangle left of a triangle",
    ),
    (
        "subject swapped (above)",
        "a triangle above a circle",
        "a circle above a triangle",
        "a square above a square",
    ),
)
#: the binding clause of each compositional task: the check that must hold once the objects are right
CLAUSES = {"position": "position", "color_attr": "color"}
LEVELS = (0.9, 0.7, 0.5)


def clause_shares(images: torch.Tensor, records: list[dict], task: str) -> dict[str, float]:
    """``objects_right`` (every named shape found exactly once) and ``clause_right_given_objects`` for the
    images of ``task``; ``images`` ``[N, 3, H, W]`` in [0, 1]."""
    objects_right = clause_right = 0
    for image, record in zip(images, records):
        checks = entry_checks(detect_objects(image.permute(1, 2, 0).numpy()), record)
        if all(check["count"] == 1.0 for check in checks):
            objects_right += 1
            clause_right += all(check.get(CLAUSES[task], 1.0) == 1.0 for check in checks)
    return {
        "images": len(records),
        "objects_right": objects_right / max(len(records), 1),
        "clause_right_given_objects": clause_right / objects_right if objects_right else float("nan"),
    }


@torch.no_grad()
def swap_sensitivity(model: ShapesDiT, samples: int = 64, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per swap of :data:`SWAPS` and level of :data:`LEVELS`, the ratio of the module docstring."""
    generator = torch.Generator().manual_seed(seed)
    result: dict[str, dict[str, float]] = {}
    for level in LEVELS:
        x = torch.randn(samples, *model.sample_shape, generator=generator)
        t = torch.full((samples,), level)
        for name, *prompts in SWAPS:
            base, swapped, other = (model(x, t, *model.encode_prompts([p] * samples)) for p in prompts)
            swap_change = (base - swapped).pow(2).mean().sqrt()
            word_change = (base - other).pow(2).mean().sqrt()
            result.setdefault(name, {})[str(level)] = float(swap_change / word_change)
    return result


def binding_check(model_name: str, images_per_task: int, num_steps: int) -> dict:
    """Both measurements of the module docstring for one model."""
    world = WORLDS["shapes"]
    model = load_shapes_model(model_name).eval()
    _, images, items, _ = evaluate(
        partial(generate, model), world.prompts("test"), images_per_task, num_steps, 1.0, world=world
    )
    clauses = {}
    for task in CLAUSES:
        rows = [index for index, (record, _) in enumerate(items) if record["tag"] == task]
        clauses[task] = clause_shares(images[rows], [items[index][0] for index in rows], task)
    return {"clauses": clauses, "sensitivity": swap_sensitivity(model)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["shapes-base"])
    parser.add_argument("--images-per-task", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help="Euler steps of the held-out samples")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="outputs/binding.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    results = {name: binding_check(name, args.images_per_task, args.steps) for name in args.models}
    print(
        f"{'model':<44}{'pos: objects':>13}{'relation|obj':>13}{'attr: objects':>14}{'colours|obj':>12}"
        + "".join(f"{name[:18]:>20}" for name, *_ in SWAPS)
    )
    for name, result in results.items():
        position, attribution = result["clauses"]["position"], result["clauses"]["color_attr"]
        ratios = "".join(
            f"{np.mean(list(result['sensitivity'][swap].values())):>20.3f}" for swap, *_ in SWAPS
        )
        print(
            f"{name[-44:]:<44}{position['objects_right']:>13.3f}{position['clause_right_given_objects']:>13.3f}"
            f"{attribution['objects_right']:>14.3f}{attribution['clause_right_given_objects']:>12.3f}{ratios}"
        )
    print("(sensitivity: the mean over t in " + ", ".join(map(str, LEVELS)) + " of the swap/word ratio)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": vars(args), "seconds": round(time.perf_counter() - started, 1), "results": results}
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
