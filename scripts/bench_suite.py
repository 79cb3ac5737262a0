"""The learning benchmark's suite (``configs/bench/<name>.yaml``) and its recipes resolved to run lengths:
the types :mod:`bench_learning` runs and :mod:`learning_report` reports on."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from flowrl.config import load_config

SUITES = Path("configs/bench")


@dataclass
class Suite:
    """A benchmark suite (``configs/bench/<name>.yaml``): what runs, how long, and what it is compared with."""

    #: recipe name -> config file (every recipe's images per step must divide ``images``)
    recipes: dict[str, str]
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    #: images (final samples) every run trains on: the equal budget
    images: int = 3840
    #: recipe name -> its own image budget where it differs from ``images`` (a long run of a slow learner
    #: beside the reference's usual budget, to time its crossing of the targets)
    recipe_images: dict[str, int] = field(default_factory=dict)
    #: the held-out evaluation (CFG-free) runs every this many images
    eval_every_images: int = 1280
    #: the evaluation's images per task and Euler steps (``None``: the recipe's own)
    eval_images_per_task: int = 64
    eval_num_steps: int | None = None
    base_guidance_scales: list[float] = field(default_factory=lambda: [1.0, 3.0])
    best_of: list[int] = field(default_factory=lambda: [4, 8])
    #: held-out gains over the base (CFG-free) whose first crossing is timed
    targets: list[float] = field(default_factory=lambda: [0.05, 0.10])
    #: time-to-target ratios are to this recipe
    reference: str = "nft"
    #: overrides for every run
    overrides: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Suite:
        raw = yaml.safe_load(path.read_text()) or {}
        allowed = [item.name for item in fields(cls)]
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise SystemExit(f"{path}: unknown keys {unknown}; allowed: {allowed}")
        suite = cls(**raw)
        if not suite.recipes or not suite.seeds:
            raise SystemExit(f"{path}: a suite needs at least one recipe and one seed")
        unknown_budgets = sorted(set(suite.recipe_images) - set(suite.recipes))
        if unknown_budgets:
            raise SystemExit(
                f"{path}: recipe_images names {unknown_budgets}, which are not recipes of the suite"
            )
        if suite.reference not in suite.recipes:
            raise SystemExit(
                f"{path}: reference={suite.reference!r} is not one of the recipes {list(suite.recipes)}"
            )
        if any(n < 1 for n in suite.best_of):
            raise SystemExit(f"{path}: best_of={suite.best_of} must hold positive sample counts")
        return suite


@dataclass(frozen=True)
class Recipe:
    """One recipe of a suite, resolved: its config file, base model, images per step and run length."""

    name: str
    path: str
    base_model: str
    images_per_step: int
    steps: int
    eval_every: int
    eval_num_steps: int

    def run_dir(self, out: Path, seed: int) -> Path:
        return out / "runs" / self.name / f"seed{seed}"


def resolve(suite: Suite, name: str) -> Recipe:
    """Load and validate the recipe (no model is loaded) and fit it to the suite's budget."""
    config = load_config(suite.recipes[name], suite.overrides)
    per_step = config.images_per_step
    budget = suite.recipe_images.get(name, suite.images)
    for what, images in (("images", budget), ("eval_every_images", suite.eval_every_images)):
        if images % per_step:
            raise SystemExit(
                f"{what}={images} is not a whole number of steps of recipe {name!r} ({per_step} images per step)"
            )
    return Recipe(
        name,
        suite.recipes[name],
        config.model.name,
        per_step,
        budget // per_step,
        suite.eval_every_images // per_step,
        suite.eval_num_steps or config.evaluation.num_steps,
    )
