"""flowrl: reinforcement-learning alignment of flow-matching generators.

Public entry points: ``flowrl.models.load_shapes_model``, ``flowrl.generate.generate``,
``flowrl.evaluation.evaluate`` and the ``flowrl`` command line (``flowrl.cli``).
"""

__version__ = "0.1.0"
