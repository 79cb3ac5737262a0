"""The flowrl demo app: base and tuned models side by side, with their rewards and the run's curves.

Start it with ``flowrl demo [RUN_DIR or checkpoint]`` or ``python -m app``; see :mod:`app.app`.
"""
