"""Seeded starting noise: row ``i`` from its own generator, so a (prompt, seed) gives the same sample in any batch."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def seeded_noise(
    seeds: Sequence[int], shape: tuple[int, ...], device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[len(seeds), *shape]`` standard normal noise, row ``i`` drawn from a generator seeded with ``seeds[i]``."""
    rows = [torch.randn(shape, generator=torch.Generator().manual_seed(int(seed))) for seed in seeds]
    return torch.stack(rows).to(device)
