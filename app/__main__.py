"""``python -m app [RUN_DIR or checkpoint] [--base ...] [--runs ...] [--host ...] [--port ...] [--share]``.

The same as ``flowrl demo`` (both use :mod:`app.cli`).
"""

import sys

from app.cli import main

sys.exit(main())
