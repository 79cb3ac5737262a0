"""Scoring in the background, so that the trainer can sample the next batch meanwhile."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class AsyncScorer:
    """Runs a reward (for example a :class:`~rewards.multi.MultiReward`) on a thread pool.

    ``submit`` returns at once with a ``Future``; ``future.result()`` gives the
    scores, or raises the reward's error. Media are detached and moved to the
    CPU before submission unless ``keep_device`` is set, so the caller can
    reuse its buffers. Torch releases the GIL in its kernels, so model-based
    rewards really overlap with sampling.
    """

    def __init__(self, reward: Callable[..., Any], max_workers: int = 1, keep_device: bool = False) -> None:
        self.reward = reward
        self.keep_device = keep_device
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="flowrl-reward")

    def submit(
        self, media: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> Future:
        """Start scoring a batch; returns a ``Future`` of the reward's output."""
        media = media.detach() if self.keep_device else media.detach().cpu()
        return self._pool.submit(self.reward, media, list(prompts), list(metadata))

    def close(self) -> None:
        """Wait for running work and stop the threads."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> AsyncScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
