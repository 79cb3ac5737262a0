"""``accelerate launch -m flowrl.train CONFIG [key=value ...]``: the same as ``flowrl train`` (one process or
several), with its one-line errors (printed once, by the main process) and exit statuses."""

from __future__ import annotations

import sys

from flowrl.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
