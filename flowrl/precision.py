"""Mixed precision of the policy's velocities (``training.mixed_precision``).

``bf16`` runs each velocity call under ``torch.autocast(device, torch.bfloat16)``: matrix products (and the
other ops on autocast's lower-precision list) take bfloat16 casts of their float32 inputs and weights, the
rest stays float32, and the velocity is cast back to float32, so the sampler's log-probabilities, the
ratios and the losses are computed in float32 from float32 master weights and optimizer state. Every
role (trained, old, rollout, reference, EMA) runs the same kernels on the same inputs, so a GRPO
rollout re-scored by the trained model before its first update still gives a ratio of exactly 1.

``auto`` (the default) is ``bf16`` where it was measured to pay: a backend that says so
(``bf16_pays_on_cpu``: the shapes models, 1.44x on the main job's step) on a CPU with bfloat16 matrix
instructions (AVX-512 BF16 or AMX); ``no`` everywhere else (a GPU recipe sets its weights' dtype with
``model.dtype``). The trainer resolves it before the run starts, says which in one line, and records the
resolved value in the run's config, so a resume on a machine that resolves it otherwise is refused
rather than silently changing the numerics.

torch's autocast rather than Accelerate's ``mixed_precision``: Accelerate autocasts only the forward of
the module it prepared (the trained network), and the rollout and reference copies must run the same
numerics as the trained one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_AUTOCAST_DTYPES: dict[str, torch.dtype | None] = {"no": None, "bf16": torch.bfloat16}
AUTO = "auto"
#: the values of ``training.mixed_precision``
MIXED_PRECISIONS = (AUTO, *_AUTOCAST_DTYPES)


def cpu_has_bfloat16_matmul() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (AVX-512 BF16 or AMX tiles), as torch detects them."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_mixed_precision(
    mixed_precision: str, device: torch.device, bf16_pays_on_cpu: bool
) -> tuple[str, str]:
    """``(value, why)``: ``auto`` made ``bf16`` or ``no`` (module docstring) with the one line that says why;
    any other value as it is, with no line."""
    if mixed_precision != AUTO:
        return mixed_precision, ""
    if device.type != "cpu":
        return "no", f"mixed precision: float32 (auto on {device.type}: the model's own dtype, model.dtype)"
    if not bf16_pays_on_cpu:
        return (
            "no",
            "mixed precision: float32 (auto: bfloat16 autocast was not measured to pay for this backend)",
        )
    if not cpu_has_bfloat16_matmul():
        return "no", "mixed precision: float32 (auto: this CPU has no bfloat16 matrix instructions)"
    return "bf16", (
        "mixed precision: bf16 (auto: this CPU has bfloat16 matrix instructions; "
        "training.mixed_precision=no for float32)"
    )


def autocast_dtype(mixed_precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved ``training.mixed_precision`` value (None: float32 throughout);
    ``auto`` is resolved first (:func:`resolve_mixed_precision`)."""
    if mixed_precision not in _AUTOCAST_DTYPES:
        raise ValueError(
            f"mixed_precision={mixed_precision!r} is not allowed here; choose one of {tuple(_AUTOCAST_DTYPES)} "
            f"({AUTO!r} is resolved to one of them by resolve_mixed_precision)"
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
