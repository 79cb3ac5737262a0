"""The reward contract and its boundary check.

A reward is a callable ``(media, prompts, metadata) -> Tensor[B] | dict[str, Tensor[B]]``
where media are float tensors in [0, 1] (images ``[B, 3, H, W]``, videos
``[B, T, 3, H, W]``). Class rewards set ``modality`` ("image" or "video") and
may hold models built once in ``__init__`` (``device`` and ``dtype`` keyword
arguments by convention). :func:`checked_scores` is what every caller goes
through: whatever a reward returns, the caller gets ``dict[str, Tensor[B]]``
on the CPU in float32, or a :class:`RewardError` naming the reward and the
offending batch indices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

MODALITIES = ("image", "video")
RewardOutput = torch.Tensor | Mapping[str, torch.Tensor]
RewardFn = Callable[[torch.Tensor, Sequence[str], Sequence[Mapping[str, Any]]], RewardOutput]


class RewardError(RuntimeError):
    """A reward failed or returned something outside its contract."""


def modality_of(reward: Any) -> str:
    """The reward's declared modality; plain functions are image rewards."""
    modality = getattr(reward, "modality", "image")
    if modality not in MODALITIES:
        raise RewardError(f"reward {reward!r} declares modality {modality!r}; allowed: {MODALITIES}")
    return modality


def check_media(name: str, media: torch.Tensor, modality: str) -> None:
    """Raise :class:`RewardError` unless ``media`` has the shape the modality needs."""
    expected = 4 if modality == "image" else 5
    if media.ndim != expected or media.shape[-3] != 3:
        layout = "[B, 3, H, W]" if modality == "image" else "[B, T, 3, H, W]"
        raise RewardError(
            f"reward {name!r} ({modality}) expects media {layout}, got shape {tuple(media.shape)}"
        )


def checked_scores(name: str, output: RewardOutput, batch_size: int) -> dict[str, torch.Tensor]:
    """``output`` as ``{sub-score: Tensor[B]}`` (CPU, float32), or :class:`RewardError`.

    A bare tensor becomes ``{name: tensor}``. Every value must be shape
    ``[batch_size]`` and finite; the error lists the non-finite indices.
    Values are never altered otherwise.
    """
    scores = {name: output} if isinstance(output, torch.Tensor) else output
    if not isinstance(scores, Mapping) or not scores:
        raise RewardError(
            f"reward {name!r} returned {type(output).__name__}; expected Tensor[B] or dict[str, Tensor[B]]"
        )
    checked: dict[str, torch.Tensor] = {}
    for key, value in scores.items():
        label = name if key == name else f"{name}/{key}"
        if not isinstance(value, torch.Tensor):
            try:
                value = torch.as_tensor(value)
            except (TypeError, ValueError) as error:
                raise RewardError(
                    f"reward {label!r} returned {type(value).__name__}, not a tensor"
                ) from error
        if value.shape != (batch_size,):
            raise RewardError(
                f"reward {label!r} returned shape {tuple(value.shape)}; expected ({batch_size},)"
            )
        value = value.detach().to("cpu", torch.float32)
        bad = (~torch.isfinite(value)).nonzero().flatten().tolist()
        if bad:
            raise RewardError(
                f"reward {label!r} returned non-finite scores at batch indices {bad}: {value[bad].tolist()}"
            )
        checked[key] = value
    return checked


def score(
    name: str,
    reward: RewardFn,
    media: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[Mapping[str, Any]],
) -> dict[str, torch.Tensor]:
    """Call ``reward`` and check its output; any exception inside it becomes a :class:`RewardError` naming it."""
    if len(prompts) != media.shape[0] or len(metadata) != media.shape[0]:
        raise RewardError(
            f"reward {name!r}: {media.shape[0]} media, {len(prompts)} prompts and {len(metadata)} metadata entries"
        )
    check_media(name, media, modality_of(reward))
    try:
        output = reward(media, prompts, metadata)
    except RewardError:
        raise
    except Exception as error:
        raise RewardError(f"reward {name!r} raised {type(error).__name__}: {error}") from error
    return checked_scores(name, output, media.shape[0])
