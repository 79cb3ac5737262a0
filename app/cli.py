"""The demo's command line, shared by ``python -m app`` and ``flowrl demo``.

The app depends on ``flowrl``, never the other way round: ``flowrl demo``
hands its arguments to :func:`main` here (imported only when the command runs).
"""

from __future__ import annotations

import argparse
import sys

from flowrl.shipped_models import DEFAULT_BASE


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The demo's arguments (model choice, where runs live, where to serve, whether runs may name code)."""
    parser.add_argument(
        "tuned",
        nargs="?",
        default=None,
        help="run directory, checkpoint or model directory (default: newest run)",
    )
    parser.add_argument(
        "--base",
        default=None,
        help=f"shipped model name or model directory (default: the tuned run's own base, else {DEFAULT_BASE})",
    )
    parser.add_argument("--runs", default="runs", help="directory whose runs the run selector lists")
    parser.add_argument(
        "--host", default="127.0.0.1", help="bind address; loopback unless you mean to expose it"
    )
    parser.add_argument("--port", type=int, default=None, help="port (default: 7860, or the next free one)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the demo is reached by, besides IP addresses and localhost (a reverse proxy's or "
        "share link's public name; repeat); '*' allows any (app/origins.py)",
    )
    parser.add_argument(
        "--trust-run-code",
        action="store_true",
        help="let a run's config.yaml name rewards by dotted path (package.module:Name), which the app imports "
        "and runs, and give rewards files to read or addresses to connect to (remote's url, checkpoint paths): "
        "only for runs you trust (default: registered rewards with their own weights only)",
    )
    return parser


def build_parser(prog: str = "python -m app") -> argparse.ArgumentParser:
    return add_arguments(
        argparse.ArgumentParser(prog=prog, description="Gradio app: base vs tuned model side by side")
    )


def main(argv: list[str] | None = None, prog: str = "python -m app") -> int:
    """Serve the demo; bad input is one line on stderr and exit status 2."""
    args = build_parser(prog).parse_args(argv)
    from app.app import launch

    try:
        launch(
            args.tuned,
            args.base,
            args.runs,
            args.host,
            args.port,
            args.share,
            trust_run_code=args.trust_run_code,
            allowed_hosts=args.allowed_host,
        )
    except (ValueError, FileNotFoundError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return 0
