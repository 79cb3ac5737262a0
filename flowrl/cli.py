"""The ``flowrl`` command line: ``flowrl sample``, ``flowrl eval``, ``flowrl pretrain-shapes``."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from flowrl.evaluation import evaluate, write_evaluation
from flowrl.generate import generate
from flowrl.grid import save_grid
from flowrl.models import load_shapes_model
from flowrl.shapes.grammar import shipped_prompts
from flowrl.shapes.pretrain import PretrainConfig, pretrain


def _sample(args: argparse.Namespace) -> None:
    model = load_shapes_model(args.model)
    prompts = [prompt for prompt in args.prompt for _ in args.seeds]
    seeds = [seed for _ in args.prompt for seed in args.seeds]
    images = generate(model, prompts, seeds, args.steps, args.cfg)
    path = save_grid(
        args.out, images, [f"{p} (seed {s})" for p, s in zip(prompts, seeds)], columns=len(args.seeds)
    )
    print(f"wrote {path}")


def _eval(args: argparse.Namespace) -> None:
    model = load_shapes_model(args.model)
    records = shipped_prompts("test")
    summary = {}
    for scale in args.cfg:
        name = "eval_cfg_free" if scale == 1.0 else f"eval_cfg_{scale:g}"
        scores, images, items, rewards = evaluate(
            model, records, args.images_per_task, args.steps, scale, args.seed
        )
        json_path, grid_path = write_evaluation(args.out, name, scores, images, items, rewards)
        summary[name] = scores
        print(
            f"guidance {scale:g}: geneval/overall {scores['geneval/overall']:.3f}  ({json_path}, {grid_path})"
        )
        for key, value in scores.items():
            if key.startswith("geneval/") and key != "geneval/overall":
                print(f"    {key:<26} {value:.3f}")
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _pretrain_shapes(args: argparse.Namespace) -> None:
    overrides = {
        f.name: getattr(args, f.name) for f in fields(PretrainConfig) if getattr(args, f.name) is not None
    }
    pretrain(PretrainConfig(**overrides), args.out)
    print(f"wrote {args.out}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every ``flowrl`` subcommand."""
    parser = argparse.ArgumentParser(prog="flowrl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    sample = commands.add_parser("sample", help="write an image grid for prompts and seeds")
    sample.add_argument("--model", default="shapes-base", help="shipped model name or model directory")
    sample.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    sample.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    sample.add_argument("--steps", type=int, default=20)
    sample.add_argument("--cfg", type=float, default=1.0, help="guidance scale; 1 = no guidance")
    sample.add_argument("--out", default="outputs/samples.png")
    sample.set_defaults(run=_sample)

    evaluation = commands.add_parser("eval", help="GenEval-style scores on the held-out shapes prompts")
    evaluation.add_argument("--model", default="shapes-base", help="shipped model name or model directory")
    evaluation.add_argument("--cfg", type=float, nargs="+", default=[1.0], help="guidance scales to evaluate")
    evaluation.add_argument("--images-per-task", type=int, default=64)
    evaluation.add_argument("--steps", type=int, default=20)
    evaluation.add_argument("--seed", type=int, default=0)
    evaluation.add_argument("--out", default="outputs/eval")
    evaluation.set_defaults(run=_eval)

    pretrain = commands.add_parser("pretrain-shapes", help="pretrain the shapes base model from scratch")
    pretrain.add_argument("--out", required=True, help="directory for the model and pretrain.json")
    for f in fields(PretrainConfig):
        pretrain.add_argument(
            f"--{f.name.replace('_', '-')}", dest=f.name, type=type(f.default), default=None
        )
    pretrain.set_defaults(run=_pretrain_shapes)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a ``flowrl`` subcommand; bad input is one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"flowrl {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
