"""``flowrl train CONFIG [key=value ...]`` and ``accelerate launch -m flowrl.train CONFIG [key=value ...]``."""

from __future__ import annotations

import argparse
import sys

from flowrl.config import ConfigError, load_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowrl train",
        description="Online RL fine-tuning from a YAML config (see configs/).",
        epilog="Overrides are section.key=value, e.g. training.steps=50 logging.output_dir=runs/try resume=latest",
    )
    parser.add_argument("config", help="YAML config file")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides (value read as YAML)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as error:
        sys.exit(f"flowrl train: config error: {error}")
    from flowrl.trainer import train

    train(config)


if __name__ == "__main__":
    main()
