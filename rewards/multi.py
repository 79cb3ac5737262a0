"""Several rewards as one: scoring every entry and weighing the scores into a total.

``MultiReward({"pickscore": 1.0, "hpsv2": 0.5})`` or with richer settings::

    MultiReward({
        "verifier": {"reward": "shapes_verifier", "weight": 1.0, "key": "partial"},
        "clip": {"reward": "clip_score", "weight": 0.1, "settings": {"model_name": "ViT-B-32"}},
    }, aggregation="gdpo")

Each entry's ``reward`` defaults to the entry's name; ``key`` picks the
sub-score that enters the aggregate (default: the reward's only score, or
its class attribute ``primary_score``); ``offload: true`` keeps a model-based
reward's network (its ``model`` on its ``device``) on the CPU between calls,
freeing accelerator memory for the policy while it is idle.

When a reward fails (it raises, times out, or returns NaN or the wrong shape),
its entry's ``on_error`` decides: ``raise`` (the default) ends the call with
the :class:`~rewards.base.RewardError`; ``skip_batch`` raises
:class:`SkippedBatch`, which a trainer takes as "drop this step's update";
``zero`` scores the batch 0 for that entry and carries on (counted in
:attr:`MultiReward.failures`). ``timeout: SECONDS`` bounds one call of an
in-process reward (it runs on its own thread; a call that overruns is a
failure, and keeps running in the background, as Python threads cannot be
stopped). Calling it returns every sub-score,
checked at the boundary, labelled ``entry`` or ``entry/sub-score``. How the
scores become advantages (``sum`` or ``gdpo`` aggregation) is RL work and lives
in ``flowrl.advantages``.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rewards.base import RewardError, modality_of, score
from rewards.registry import available_rewards, build_reward, check_settings, resolve_reward

#: what an entry does when its reward fails (module docstring)
ON_ERROR = ("raise", "skip_batch", "zero")


class SkippedBatch(RewardError):
    """A reward with ``on_error: skip_batch`` failed on this batch: the caller should drop the batch."""


@dataclass
class RewardEntry:
    """One reward of a :class:`MultiReward`."""

    name: str
    reward: Any
    weight: float = 1.0
    key: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    offload: bool = False
    on_error: str = "raise"
    timeout: float | None = None

    def __post_init__(self) -> None:
        if self.offload:
            if not isinstance(getattr(self.reward, "model", None), torch.nn.Module) or not hasattr(
                self.reward, "device"
            ):
                raise ValueError(
                    f"reward entry {self.name!r} cannot be offloaded: its reward has no `model` network "
                    "and `device` (offload is for model-based rewards such as pickscore or hpsv2)"
                )
            self.reward.model.to("cpu")

    @contextlib.contextmanager
    def ready(self) -> Iterator[None]:
        """The reward's network on its device for one call (and back on the CPU after, when offloaded)."""
        if not self.offload:
            yield
            return
        self.reward.model.to(self.reward.device)
        try:
            yield
        finally:
            self.reward.model.to("cpu")


ENTRY_FIELDS = ("reward", "weight", "key", "settings", "offload", "on_error", "timeout")


def _normalised_spec(name: str, spec: Any) -> dict[str, Any]:
    """An entry's spec as a mapping, its fields and types checked (nothing is built)."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return {"weight": float(spec)}
    if not isinstance(spec, Mapping):
        raise ValueError(
            f"reward entry {name!r} must be a weight or a mapping of {ENTRY_FIELDS}, got {spec!r}"
        )
    unknown = set(spec) - set(ENTRY_FIELDS)
    if unknown:
        raise ValueError(
            f"reward entry {name!r} has unknown fields {sorted(unknown)}; allowed: {ENTRY_FIELDS}"
        )
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(f"reward entry {name!r} has weight {weight!r}; expected a finite number")
    if spec.get("on_error", "raise") not in ON_ERROR:
        raise ValueError(
            f"reward entry {name!r} has on_error {spec['on_error']!r}; allowed: {list(ON_ERROR)}"
        )
    timeout = spec.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf
    ):
        raise ValueError(f"reward entry {name!r} has timeout {timeout!r}; expected a number of seconds > 0")
    if not isinstance(spec.get("offload", False), bool):
        raise ValueError(f"reward entry {name!r} has offload {spec['offload']!r}; expected true or false")
    if not isinstance(spec.get("settings", {}), Mapping):
        raise ValueError(f"reward entry {name!r} has settings {spec['settings']!r}; expected a mapping")
    return dict(spec)


def _entry(name: str, spec: float | Mapping[str, Any]) -> RewardEntry:
    spec = _normalised_spec(name, spec)
    reward_name = spec.get("reward", name)
    settings = dict(spec.get("settings", {}))
    reward = build_reward(reward_name, **settings) if isinstance(reward_name, str) else reward_name
    weight, key, offload = float(spec.get("weight", 1.0)), spec.get("key"), spec.get("offload", False)
    timeout = spec.get("timeout")
    return RewardEntry(
        name,
        reward,
        weight,
        key,
        settings,
        offload,
        spec.get("on_error", "raise"),
        None if timeout is None else float(timeout),
    )


def _call_with_timeout(
    entry: RewardEntry, media: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
) -> dict[str, torch.Tensor]:
    """The entry's checked scores; with a ``timeout``, the call runs on its own daemon thread and an
    overrun is a :class:`RewardError`."""
    if entry.timeout is None:
        with entry.ready():
            return score(entry.name, entry.reward, media, prompts, metadata)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            with entry.ready():
                outcome["scores"] = score(entry.name, entry.reward, media, prompts, metadata)
        except BaseException as error:  # handed to the waiting thread
            outcome["error"] = error

    worker = threading.Thread(target=call, name=f"flowrl-reward-{entry.name}", daemon=True)
    worker.start()
    worker.join(entry.timeout)
    if worker.is_alive():
        raise RewardError(f"reward {entry.name!r} took longer than its timeout of {entry.timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["scores"]


class MultiReward:
    """A weighted set of rewards (see module docstring)."""

    def __init__(self, rewards: Mapping[str, float | Mapping[str, Any]]) -> None:
        if not rewards:
            raise ValueError("MultiReward needs at least one reward")
        self.entries = [_entry(name, spec) for name, spec in rewards.items()]
        modalities = {entry.name: modality_of(entry.reward) for entry in self.entries}
        if len(set(modalities.values())) > 1:
            raise ValueError(f"rewards of one MultiReward must share a modality, got {modalities}")
        self.modality = next(iter(modalities.values()))
        #: failures absorbed by ``on_error: zero`` or ``skip_batch``, per entry
        self.failures: dict[str, int] = {entry.name: 0 for entry in self.entries}
        self._labels: dict[str, list[str]] = {}

    @staticmethod
    def check_spec(rewards: Mapping[str, Any]) -> None:
        """Check a spec as :class:`MultiReward` takes it without building any reward (no weights load).

        Raises ``ValueError`` naming the entry for an empty spec, unknown fields,
        a non-numeric weight, a reward name that is neither registered, a
        plugin, nor a dotted path, or settings the reward does not take (a
        dotted path is imported for that check: only check specs you trust).
        """
        if not rewards:
            raise ValueError("at least one reward is needed")
        known = available_rewards()
        for name, spec in rewards.items():
            normalised = _normalised_spec(name, spec)
            reward_name = normalised.get("reward", name)
            if callable(reward_name):  # a callable given through the Python API
                continue
            if not isinstance(reward_name, str):
                raise ValueError(
                    f"reward entry {name!r}: reward={reward_name!r} is not allowed; give a registered reward's "
                    "name, a plugin's or a dotted path package.module:Name"
                )
            if reward_name not in known and ":" not in reward_name:
                raise ValueError(
                    f"reward entry {name!r} names unknown reward {reward_name!r}; available: {known}"
                )
            try:
                check_settings(reward_name, normalised.get("settings", {}))
            except ValueError as error:
                raise ValueError(f"reward entry {name!r}: {error}") from None
            key = normalised.get("key")
            known_keys = getattr(resolve_reward(reward_name), "score_keys", None)
            if key is not None and (not isinstance(key, str) or (known_keys and key not in known_keys)):
                allowed = f"one of {list(known_keys)}" if known_keys else "a sub-score's name"
                raise ValueError(f"reward entry {name!r}: key={key!r} is not allowed; expected {allowed}")

    @property
    def weights(self) -> dict[str, float]:
        """Weight of each entry."""
        return {entry.name: entry.weight for entry in self.entries}

    def __call__(
        self, media: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> dict[str, torch.Tensor]:
        """Every sub-score of every reward, ``{label: Tensor[B]}`` on the CPU in float32; a failing entry
        is handled by its ``on_error`` (module docstring)."""
        scores: dict[str, torch.Tensor] = {}
        for entry in self.entries:
            try:
                entry_scores = _call_with_timeout(entry, media, prompts, metadata)
            except RewardError as error:
                if entry.on_error == "raise":
                    raise
                self.failures[entry.name] += 1
                if entry.on_error == "skip_batch":
                    raise SkippedBatch(f"{error} (on_error: skip_batch)") from error
                scores.update({label: torch.zeros(media.shape[0]) for label in self._fallback_labels(entry)})
                continue
            labelled = {
                entry.name if key == entry.name else f"{entry.name}/{key}": value
                for key, value in entry_scores.items()
            }
            self._labels[entry.name] = list(labelled)
            scores.update(labelled)
        return scores

    def _fallback_labels(self, entry: RewardEntry) -> list[str]:
        """The labels an ``on_error: zero`` entry fills with zeros: those of its last good answer, else the
        one its aggregate reads."""
        if entry.name in self._labels:
            return self._labels[entry.name]
        key = entry.key or getattr(entry.reward, "primary_score", None)
        return [entry.name if key in (None, entry.name) else f"{entry.name}/{key}"]

    def components(self, scores: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The one score per entry that enters the aggregate."""
        chosen = {}
        for entry in self.entries:
            labels = [label for label in scores if label == entry.name or label.startswith(entry.name + "/")]
            key = entry.key or getattr(entry.reward, "primary_score", None)
            if key is not None:
                label = entry.name if key == entry.name else f"{entry.name}/{key}"
                if label not in scores:
                    raise ValueError(f"reward {entry.name!r} has no sub-score {key!r}; it returned {labels}")
            elif len(labels) == 1:
                label = labels[0]
            else:
                raise ValueError(f"reward {entry.name!r} returned several scores {labels}; set its 'key'")
            chosen[entry.name] = scores[label]
        return chosen

    def total(self, scores: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Weighted sum of the raw components, ``sum_k w_k r_k``."""
        components = self.components(scores)
        return sum(entry.weight * components[entry.name] for entry in self.entries)
