"""Mixed precision of the policy's velocities (``training.mixed_precision``).

``bf16`` runs each velocity call under ``torch.autocast(device, torch.bfloat16)``: matrix products (and the
other ops on autocast's lower-precision list) take bfloat16 casts of their float32 inputs and weights, the
rest stays float32, and the velocity is cast back to float32, so the sampler's log-probabilities, the
ratios and the losses are computed in float32 from float32 master weights and optimizer state. Every
role (trained, old, rollout, reference, EMA) runs the same kernels on the same inputs, so a GRPO
rollout re-scored by the trained model before its first update still gives a ratio of exactly 1.

torch's autocast rather than Accelerate's ``mixed_precision``: Accelerate autocasts only the forward of
the module it prepared (the trained network), and the rollout and reference copies must run the same
numerics as the trained one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"no": None, "bf16": torch.bfloat16}
#: the values of ``training.mixed_precision``
MIXED_PRECISIONS = tuple(_AUTOCAST_DTYPES)


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype of a ``training.mixed_precision`` value (None: float32 throughout)."""
    if mixed_precision not in _AUTOCAST_DTYPES:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not allowed; choose one of {MIXED_PRECISIONS}"
        )
    return _AUTOCAST_DTYPES[mixed_precision]


@contextlib.contextmanager
def autocast(device: torch.device, dtype: torch.dtype | None) -> Iterator[None]:
    """``torch.autocast`` on ``device``'s type in ``dtype``; nothing with ``dtype`` None."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
