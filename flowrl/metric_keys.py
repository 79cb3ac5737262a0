"""Every key a run writes to ``metrics.jsonl``, with what it means: the trainer's (:data:`STEP_METRICS`,
:data:`EVALUATION_METRICS`) and each algorithm's own (its ``metric_keys``). A key with ``<...>`` stands for
a family: one key per reward label, task or drift measure. ``docs/training.md`` lists them all (a test
keeps it equal to :func:`metrics_markdown`), and a test checks that a run logs no key declared nowhere."""

from __future__ import annotations

import re

from flowrl.algorithms import ALGORITHMS

#: what every step logs, whatever the algorithm
STEP_METRICS: dict[str, str] = {
    "step": "the training step (1-based); row 0 holds the base model's evaluation",
    "reward/mean": "mean total reward (the weighted sum of the rewards) of the step's samples, over all processes",
    "reward/<label>": "mean score of one reward (its name, or name/sub-score for a reward returning several)",
    "reward/zero_std_groups": "share of groups whose samples all got the same total reward (no signal)",
    "reward/task/<tag>": "mean total reward of the step's prompts of one task (prompts with a tag)",
    "loss": "the algorithm's loss, averaged over the step's backward units and processes",
    "grad_norm": "gradient norm before clipping, averaged over the step's optimizer updates taken",
    "skipped/updates": "optimizer updates skipped this step for a non-finite loss or gradient",
    "skipped/reward_batch": "1 on a step whose update was skipped because a reward skipped its batch",
    "lr": "learning rate after the step's updates",
    "time/rollout": "seconds sampling the rollouts (this process)",
    "time/reward": "seconds waiting for the rewards after the last rollout (they are scored alongside)",
    "time/train": "seconds from the advantages to the end of the step's updates and copies",
    "time/loss_backward": "of time/train, seconds in the losses' forward and backward passes",
    "time/optimizer": "of time/train, seconds clipping, stepping the optimizer and moving the copies",
    "time/step": "seconds of the whole step",
    "time/elapsed": "seconds since the run started (summed over resumed sessions)",
    "memory/peak_gb": "peak accelerator memory (GiB) this step on CUDA; elsewhere the process's peak resident set",
    "num_processes": "processes training",
}

#: what a row holds where the held-out evaluation ran (every ``evaluation.every`` steps and at the end)
EVALUATION_METRICS: dict[str, str] = {
    "eval/<world>/<task>": "held-out score of one task (world: geneval for images, videoeval for clips)",
    "eval/<world>/overall": "held-out score: the mean over the world's tasks",
    "eval/drift/<measure>": "how far the samples' colours moved from what the prompts ask (colour_tv)",
}


def declared_keys(algorithm: str) -> dict[str, str]:
    """Every key a run of ``algorithm`` may log, with its meaning."""
    return {**STEP_METRICS, **EVALUATION_METRICS, **ALGORITHMS[algorithm].algorithm.metric_keys}


def undeclared(keys: list[str], algorithm: str) -> list[str]:
    """The ``keys`` (of a run's ``metrics.jsonl``) that no declared key or family matches."""
    patterns = [
        re.compile("^" + re.sub(r"<[^>]+>", ".+", re.escape(key)) + "$") for key in declared_keys(algorithm)
    ]
    return sorted(key for key in keys if not any(pattern.match(key) for pattern in patterns))


def metrics_markdown() -> str:
    """The metric tables of ``docs/training.md``: the trainer's, then each algorithm's."""
    lines = ["| key | meaning |", "|---|---|"]
    lines += [f"| `{key}` | {meaning} |" for key, meaning in {**STEP_METRICS, **EVALUATION_METRICS}.items()]
    for name, entry in ALGORITHMS.items():
        lines += ["", f"`{name}` ({entry.algorithm.__name__}) adds:", "", "| key | meaning |", "|---|---|"]
        lines += [f"| `{key}` | {meaning} |" for key, meaning in entry.algorithm.metric_keys.items()]
    return "\n".join(lines) + "\n"
