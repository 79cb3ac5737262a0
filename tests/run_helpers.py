"""Training a recipe into a test's folder, the shared step of the exact-resume tests."""

from pathlib import Path

from flowrl.config import load_config
from flowrl.trainer import Trainer


def trained(recipe: str, overrides: list[str], output_dir: Path, steps: int, *extra: str) -> Trainer:
    """``recipe`` with ``overrides`` trained for ``steps`` into ``output_dir`` (``extra``: e.g. a resume)."""
    config = load_config(
        recipe, [*overrides, f"training.steps={steps}", f"logging.output_dir={output_dir}", *extra]
    )
    trainer = Trainer(config)
    trainer.train()
    return trainer
