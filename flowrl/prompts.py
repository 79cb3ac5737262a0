"""Training prompts and the group-aware batch of each step.

Every step draws ``prompts_per_step`` distinct prompts with a generator seeded
by ``(seed, step)`` (uniformly, or per task tag: equally, or as ``data.task_weights``
say) and repeats each ``group_size`` times, so the global
sample list is the same on every process and after a resume (the data
position is the step). Process ``k`` of ``n`` takes the ``k``-th contiguous
slice: whole groups whenever the per-process share is a multiple of the group
size; advantages are computed on the gathered global batch either way.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowrl.worlds import SHIPPED_TRAIN_PROMPTS, PromptRecord


def load_prompts(spec: str) -> list[PromptRecord]:
    """A world's shipped training split (``shapes-train``, ``video-shapes-train``), a ``.jsonl`` of records
    with a ``prompt``, or a ``.txt`` (one per line)."""
    if spec in SHIPPED_TRAIN_PROMPTS:
        return SHIPPED_TRAIN_PROMPTS[spec].prompts("train")
    path = Path(spec)
    if path.suffix not in (".jsonl", ".txt"):
        raise ValueError(
            f"prompt file {spec!r} is not allowed; use one of {sorted(SHIPPED_TRAIN_PROMPTS)}, a .jsonl or a .txt "
            "file"
        )
    if not path.is_file():
        raise ValueError(f"prompt file {spec!r} does not exist")
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    if path.suffix == ".txt":
        records: list[PromptRecord] = [{"prompt": line.strip()} for line in lines]
    else:
        records = []
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: record {number} is not JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: record {number} is {type(record).__name__}; expected an object")
            records.append(record)
    bad = [index for index, record in enumerate(records, 1) if not isinstance(record.get("prompt"), str)]
    if bad:
        raise ValueError(f"{path}: records {bad[:5]} have no 'prompt' string (a prompt is text)")
    if not records:
        raise ValueError(f"prompt file {spec!r} holds no prompts")
    return records


@dataclass(frozen=True)
class StepSamples:
    """The global samples of one step: their prompt records, group ids and noise seeds."""

    records: list[PromptRecord]
    group_ids: list[int]
    seeds: list[int]

    def shard(self, process_index: int, num_processes: int) -> StepSamples:
        """The contiguous slice of process ``process_index``."""
        size = len(self.records) // num_processes
        part = slice(process_index * size, (process_index + 1) * size)
        return StepSamples(self.records[part], self.group_ids[part], self.seeds[part])


def prompt_weights(
    prompts: list[PromptRecord], sampling: str, task_weights: Mapping[str, float] | None = None
) -> np.ndarray:
    """Draw probabilities: ``1/N`` each ("uniform"), or, "balanced", a task's share ``w_tag / sum_t w_t``
    split evenly over its ``n_tag`` prompts: ``p_i = w_tag / (n_tag * sum_t w_t)``, with ``w_t`` from
    ``task_weights`` (1 for a task it does not name; all 1 gives ``1 / (T * n_tag)``, ``T`` tags).

    "balanced" needs a ``tag`` on every record (the shapes prompts carry one); ``task_weights`` only
    goes with "balanced" and must name tags of ``prompts``.
    """
    task_weights = dict(task_weights or {})
    if sampling == "uniform":
        if task_weights:
            raise ValueError(
                "task_weights need sampling='balanced' (uniform sampling weighs every prompt equally)"
            )
        return np.full(len(prompts), 1.0 / len(prompts))
    if sampling != "balanced":
        raise ValueError(f"sampling={sampling!r} is not allowed; use 'uniform' or 'balanced'")
    untagged = [index for index, record in enumerate(prompts) if "tag" not in record]
    if untagged:
        raise ValueError(
            f"sampling='balanced' needs a 'tag' on every prompt; records {untagged[:5]} have none"
        )
    tags = [record["tag"] for record in prompts]
    counts = Counter(tags)
    unknown = sorted(set(task_weights) - set(counts))
    if unknown:
        raise ValueError(
            f"task_weights name tags {unknown} that no prompt has; the prompts' tags: {sorted(counts)}"
        )
    weight = {tag: float(task_weights.get(tag, 1.0)) for tag in counts}
    total = sum(weight.values())
    if total <= 0:
        raise ValueError(
            f"task_weights={task_weights} leave no task to draw; at least one weight must be > 0"
        )
    return np.array([weight[tag] / (counts[tag] * total) for tag in tags])


def step_samples(
    prompts: list[PromptRecord],
    step: int,
    prompts_per_step: int,
    group_size: int,
    seed: int,
    weights: np.ndarray | None = None,
) -> StepSamples:
    """The samples of ``step``: distinct prompts (drawn with ``weights``, uniform when None), each
    ``group_size`` times in a row, with their noise seeds."""
    if prompts_per_step > len(prompts):
        raise ValueError(
            f"prompts_per_step={prompts_per_step} is more than the {len(prompts)} prompts available"
        )
    rng = np.random.default_rng([seed, step])
    chosen = rng.choice(len(prompts), size=prompts_per_step, replace=False, p=weights)
    records = [prompts[int(index)] for index in chosen for _ in range(group_size)]
    group_ids = [group for group in range(prompts_per_step) for _ in range(group_size)]
    seeds = [int(value) for value in rng.integers(0, 2**31 - 1, size=len(records))]
    return StepSamples(records, group_ids, seeds)
