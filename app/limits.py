"""What one request to the demo may ask for: the checks every generation passes before a model loads."""

from __future__ import annotations

import math

from samplers import ODE_SOLVERS

MAX_IMAGES = 8
MAX_STEPS = 100
#: the largest guidance scale the app takes (its sliders go to 10)
MAX_CFG = 20.0
#: the largest request body the server accepts: the app takes no uploads, its requests are a few KB
MAX_REQUEST_SIZE = "1mb"


def check_settings(
    seed: int, num_images: int, num_steps: int, sampler: str, scales: tuple[float, float]
) -> None:
    """A ``ValueError`` (shown as the page's message) for a setting outside what the app allows."""
    if seed < 0:
        raise ValueError(f"The seed must be at least 0, got {seed}.")
    if not 1 <= num_images <= MAX_IMAGES:
        raise ValueError(f"The number of images must be between 1 and {MAX_IMAGES}, got {num_images}.")
    if not 1 <= num_steps <= MAX_STEPS:
        raise ValueError(f"The number of steps must be between 1 and {MAX_STEPS}, got {num_steps}.")
    if not isinstance(sampler, str) or sampler not in ODE_SOLVERS:
        raise ValueError(f"Unknown sampler {sampler!r}; choose one of {', '.join(ODE_SOLVERS)}.")
    if not all(math.isfinite(scale) and 0 <= scale <= MAX_CFG for scale in scales):
        raise ValueError(
            f"CFG scales must be finite numbers from 0 to {MAX_CFG:g} (1 = no guidance), got {scales}."
        )
