"""A run's randomness: the generator of a step's algorithm draws, and each process's RNG states as a
checkpoint keeps them (so that a resumed run continues exactly)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def step_generator(seed: int, step: int) -> torch.Generator:
    """The CPU generator of a step's algorithm draws (the same on every process)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def rng_state() -> dict[str, Any]:
    """The process's torch, NumPy and Python RNG states in types ``torch.load(weights_only=True)`` reads
    (NumPy's key array as a tensor)."""
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (or a checkpoint of an earlier version: NumPy's own tuple)."""
    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    if isinstance(numpy_state, tuple):
        np.random.set_state(numpy_state)
    else:
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["position"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )
    random.setstate(state["python"])
