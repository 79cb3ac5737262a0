"""The ``flowrl`` command line: ``sample``, ``eval``, ``train``, ``config``, ``rewards``, ``reward-server``,
``pretrain-shapes``, ``demo``.

Each command imports what it needs when it runs (torch and the models take
seconds), so ``flowrl --help`` and ``--version`` answer at once. Bad input is
one line on stderr (exit status 2); a failure during a run (a reward, non-finite
training, a full disk) is one line too (exit status 1); Ctrl-C during training
exits with 130 and says how to resume.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import fields
from importlib import metadata
from pathlib import Path

from flowrl.shipped_models import DEFAULT_BASE

DESCRIPTION = """\
flowrl: reinforcement-learning alignment of flow-matching image and video generators.
"flowrl COMMAND --help" tells more about a command; the README has a walk-through."""

TRAIN_EPILOG = """\
overrides are section.key=value, the value read as YAML:
  training.steps=50  evaluation.guidance_scales=[1,3]  logging.output_dir=runs/mine
resume=latest continues the run in logging.output_dir from its newest usable checkpoint
(resume=PATH names a checkpoint folder). Every key, its default and what is allowed:
flowrl config CONFIG (this config resolved, with each key's help) and docs/settings.md; recipes: configs/."""


def _sample(args: argparse.Namespace) -> None:
    from flowrl.generate import generate
    from flowrl.grid import save_grid
    from flowrl.models import load_shapes_model
    from flowrl.video_shapes.first_frame import shipped_records

    model = load_shapes_model(args.model)
    prompts = [prompt for prompt in args.prompt for _ in args.seeds]
    seeds = [seed for _ in args.prompt for seed in args.seeds]
    records = shipped_records(prompts) if model.config.image_condition else None  # their first frames
    images = generate(model, prompts, seeds, args.steps, args.cfg, records=records)
    path = save_grid(
        args.out, images, [f"{p} (seed {s})" for p, s in zip(prompts, seeds)], columns=len(args.seeds)
    )
    print(f"wrote {path}")


def _eval(args: argparse.Namespace) -> None:
    import json
    from functools import partial

    from flowrl.evaluation import evaluate, write_evaluation
    from flowrl.generate import generate
    from flowrl.models import load_shapes_model
    from flowrl.worlds import world_of_model

    model = load_shapes_model(args.model)
    world = world_of_model(model.is_video, model.config.image_condition)
    records = world.prompts(args.split)
    overall = world.score_key("overall")
    summary = {}
    for scale in args.cfg:
        name = "eval_cfg_free" if scale == 1.0 else f"eval_cfg_{scale:g}"
        scores, media, items, rewards = evaluate(
            partial(generate, model), records, args.images_per_task, args.steps, scale, args.seed, world
        )
        scores["split"] = args.split
        json_path, grid_path = write_evaluation(args.out, name, scores, media, items, rewards, world=world)
        summary[name] = scores
        print(f"guidance {scale:g}: {overall} {scores[overall]:.3f}  ({json_path}, {grid_path})")
        for key, value in scores.items():
            if key.startswith(f"{world.score_prefix}/") and key != overall:
                print(f"    {key:<26} {value:.3f}")
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _pretrain_shapes(args: argparse.Namespace) -> None:
    from flowrl.config_schema import build_section
    from flowrl.pretrain import PretrainConfig, pretrain

    overrides = {
        f.name: getattr(args, f.name) for f in fields(PretrainConfig) if getattr(args, f.name) is not None
    }
    pretrain(build_section(PretrainConfig, overrides, "pretrain-shapes --"), args.out, resume=args.resume)
    print(f"wrote {args.out}")


def _parse_settings(pairs: list[str]) -> dict[str, object]:
    """``["key=value", ...]`` to a dict; values are read as YAML scalars (numbers, booleans, strings).

    ``dtype=NAME`` becomes the torch dtype (one of :data:`DTYPES`).
    """
    from flowrl.models.dtypes import DTYPES
    from flowrl.yaml_reading import parse_yaml

    settings: dict[str, object] = {}
    for pair in pairs:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise ValueError(f"setting {pair!r} is not key=value")
        if key == "dtype":
            if value not in DTYPES:
                raise ValueError(f"setting dtype={value!r} is not allowed; allowed: {sorted(DTYPES)}")
            settings[key] = DTYPES[value]
        else:
            settings[key] = parse_yaml(value, f"setting {pair!r}")
    return settings


def _rewards_list(args: argparse.Namespace) -> None:
    from rewards import describe_rewards

    rows = describe_rewards()
    width = max(len(row.name) for row in rows)
    print(f"{'reward':<{width}}  {'modality':<8}  {'source':<10}  weights")
    for row in rows:
        print(f"{row.name:<{width}}  {row.modality:<8}  {row.source:<10}  {row.weights}")


def _reward_server(args: argparse.Namespace) -> None:
    from rewards import build_reward
    from rewards.server import Limits, serve

    chosen = {limit.name: getattr(args, limit.name) for limit in fields(Limits)}
    limits = Limits(**{key: value for key, value in chosen.items() if value is not None})
    _working_directory_on_path()
    reward = build_reward(args.reward, **_parse_settings(args.setting))
    serve(args.reward, reward, args.host, args.port, limits, args.docs)


def _working_directory_on_path() -> None:
    """Let dotted-path rewards (``myreward:score``) import from the working directory, as ``python -m``
    does (appended, so it never shadows an installed package)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


def _config(args: argparse.Namespace) -> None:
    from flowrl.config import load_config
    from flowrl.config_help import render_config, settings_markdown

    if args.markdown:
        print(settings_markdown(), end="")
    else:
        print(render_config(load_config(args.config, args.overrides), args.diff), end="")


def _train(args: argparse.Namespace) -> int:
    from flowrl.config import load_config
    from flowrl.trainer import Trainer

    _working_directory_on_path()
    trainer = Trainer(load_config(args.config, args.overrides))
    try:
        trainer.train()
    except KeyboardInterrupt:
        command = " ".join(
            ["flowrl train", args.config, *[o for o in args.overrides if not o.startswith("resume=")]]
        )
        _print_once(
            f"\nflowrl train: interrupted at step {trainer.step}; continue from its last checkpoint with:\n"
            f"  {command} resume=latest"
        )
        return 130
    return 0


def _demo(args: argparse.Namespace) -> int:
    from app.cli import main as demo_main  # the app builds on flowrl: imported only when it runs

    return demo_main(args.arguments, prog="flowrl demo")


#: the largest guidance scale the command line takes (the shapes models use 1 to 5; SD3 recipes up to 7)
MAX_GUIDANCE = 100.0


def guidance_scale(text: str) -> float:
    """A finite guidance scale in [0, :data:`MAX_GUIDANCE`] (argparse type: its error is the usage line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0.0 <= value <= MAX_GUIDANCE:
        raise argparse.ArgumentTypeError(
            f"{text} is not allowed; expected a finite scale in [0, {MAX_GUIDANCE:g}]"
        )
    return value


def boolean(text: str) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``; argparse type)."""
    values = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in values:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; expected true or false")
    return values[text.lower()]


def positive_int(text: str) -> int:
    """An integer of at least 1 (argparse type)."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An integer of at least 0 (argparse type)."""
    return _int_at_least(text, 0)


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is not allowed; expected at least {minimum}")
    return value


def server_limit_fields() -> tuple:
    """The fields of ``rewards.server_limits.Limits``: one flag each, its help from the field."""
    from rewards.server_limits import Limits

    return fields(Limits)


def build_parser(server_limits: bool = True) -> argparse.ArgumentParser:
    """The argument parser of every ``flowrl`` subcommand; ``server_limits=False`` leaves out
    ``reward-server``'s limit flags, whose definition imports ``rewards`` (and torch: a second)."""

    parser = argparse.ArgumentParser(
        prog="flowrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"flowrl {metadata.version('flowrl')}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sample = commands.add_parser("sample", help="write an image grid for prompts and seeds")
    sample.add_argument("--model", default=DEFAULT_BASE, help="shipped model name or model directory")
    sample.add_argument("--prompt", action="append", required=True, help="a prompt (repeat for several)")
    sample.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1, 2, 3])
    sample.add_argument("--steps", type=positive_int, default=20)
    sample.add_argument("--cfg", type=guidance_scale, default=1.0, help="guidance scale; 1 = no guidance")
    sample.add_argument("--out", default="outputs/samples.png")
    sample.set_defaults(run=_sample)

    evaluation = commands.add_parser(
        "eval",
        help="GenEval-style scores on the held-out (or training) prompts of the model's world (shapes images or "
        "moving-shapes clips)",
    )
    evaluation.add_argument("--model", default=DEFAULT_BASE, help="shipped model name or model directory")
    evaluation.add_argument(
        "--cfg", type=guidance_scale, nargs="+", default=[1.0], help="guidance scales to evaluate"
    )
    evaluation.add_argument("--images-per-task", type=positive_int, default=64)
    evaluation.add_argument("--steps", type=positive_int, default=20)
    evaluation.add_argument("--seed", type=non_negative_int, default=0)
    evaluation.add_argument(
        "--split",
        choices=("test", "train"),
        default="test",
        help="the held-out prompts (default) or the training prompts: their gap shows over-fitting",
    )
    evaluation.add_argument("--out", default="outputs/eval")
    evaluation.set_defaults(run=_eval)

    rewards_command = commands.add_parser("rewards", help="reward registry")
    rewards_actions = rewards_command.add_subparsers(dest="action", required=True)
    rewards_actions.add_parser("list", help="available rewards, modality, weights").set_defaults(
        run=_rewards_list
    )

    server = commands.add_parser(
        "reward-server", help="serve a registered reward over HTTP (rewards.remote protocol)"
    )
    server.add_argument("--reward", required=True, help="registered name, plugin name or package.module:Name")
    server.add_argument(
        "--setting", action="append", default=[], help="key=value passed to the reward (repeat)"
    )
    server.add_argument(
        "--host", default="127.0.0.1", help="bind address; loopback unless you mean to expose it"
    )
    server.add_argument("--port", type=int, default=8700)
    for limit in server_limit_fields() if server_limits else ():
        server.add_argument(
            f"--{limit.name.replace('_', '-')}",
            type=int if limit.type == "int" else float,
            help=f"{limit.metadata['help']} (default {limit.default})",
        )
    server.add_argument("--docs", action="store_true", help="serve FastAPI's /docs, /redoc and /openapi.json")
    server.set_defaults(run=_reward_server)

    pretrain = commands.add_parser(
        "pretrain-shapes", help="pretrain a shapes model: flow matching, or MeanFlow (--objective meanflow)"
    )
    pretrain.add_argument("--out", required=True, help="directory for the model and pretrain.json")
    from flowrl.pretrain_config import PretrainConfig  # a leaf module: its fields are the flags

    pretrain.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in OUT/checkpoints (see --checkpoint-every); "
        "a fresh start when there is none",
    )
    for f in fields(PretrainConfig):
        pretrain.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            type=boolean if isinstance(f.default, bool) else type(f.default),
            default=None,
        )
    pretrain.set_defaults(run=_pretrain_shapes)

    train = commands.add_parser(
        "train",
        help="online RL fine-tuning from a YAML config",
        description="Online RL fine-tuning from a YAML config (accelerate launch -m flowrl.cli train ... "
        "for several processes).",
        epilog=TRAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("config", help="YAML config file (see configs/)")
    train.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="overrides, e.g. training.steps=50 resume=latest"
    )
    train.set_defaults(run=_train)

    show = commands.add_parser(
        "config",
        help="print a config resolved, each key with its help and default",
        description="Print a training config as flowrl train reads it (defaults filled in, overrides applied, "
        "checked), each key with its help text and, where it differs, its default.",
    )
    show.add_argument("config", nargs="?", help="YAML config file (default: the built-in defaults)")
    show.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides, as for flowrl train")
    show.add_argument(
        "--diff", action="store_true", help="only the keys whose value differs from the default"
    )
    show.add_argument(
        "--markdown", action="store_true", help="the reference of every key instead (docs/settings.md)"
    )
    show.set_defaults(run=_config)

    demo = commands.add_parser(
        "demo",
        add_help=False,
        help="Gradio app: base vs tuned model side by side, with their rewards (flowrl demo --help)",
    )
    demo.add_argument("arguments", nargs=argparse.REMAINDER, help="the app's arguments (app/cli.py)")
    demo.set_defaults(run=_demo)
    return parser


def _print_once(message: str) -> None:
    """Print to stderr on the main process only (``RANK`` 0 or unset), so that a multi-process run
    reports a config error once."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run a ``flowrl`` subcommand (module docstring for exit statuses)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:  # the app parses its own arguments, --help included
        return _demo(argparse.Namespace(arguments=argv[1:]))
    args = build_parser(server_limits=argv[:1] == ["reward-server"]).parse_args(argv)
    from flowrl.checkpoint import CheckpointError
    from rewards import RewardError

    try:
        status = args.run(args)
    except (ValueError, FileNotFoundError, NotADirectoryError, CheckpointError) as error:
        _print_once(f"flowrl {args.command}: error: {error}")
        return 2
    except (RewardError, FloatingPointError, OSError) as error:  # OSError: e.g. the disk is full
        _print_once(f"flowrl {args.command}: failed: {error}")
        return 1
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
