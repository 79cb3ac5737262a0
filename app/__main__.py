"""``python -m app [RUN_DIR or checkpoint] [--base ...] [--runs ...] [--host ...] [--port ...] [--share]``.

The same as ``flowrl demo`` (whose parser it uses).
"""

import sys

from flowrl.cli import main

sys.exit(main(["demo", *sys.argv[1:]]))
