"""OCR reward (Flow-GRPO's text rendering task) with RapidOCR (PP-OCRv4 on onnxruntime).

The target text is ``metadata["text"]`` or, failing that, the first quoted
span of the prompt (``a sign that says "open"``). The image is read with
RapidOCR, whose wheel ships its ONNX models (nothing is downloaded), all
recognised text is joined, and both strings are lower-cased without spaces::

    score = 1 - min(1, levenshtein(recognised, target) / len(target))

Install with the ``ocr`` extra (``rapidocr-onnxruntime``, ``rapidfuzz``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

#: A quoted span: "...", “...”, ‘...’, or '...' whose quotes are not inside a word
#: (so the apostrophes of "don't" or "Joe's" neither open nor close a span).
_QUOTED = re.compile(r"\"(.+?)\"|“(.+?)”|‘(.+?)’|(?<!\w)'(.+?)'(?!\w)")


def target_text(prompt: str, metadata: Mapping[str, Any]) -> str:
    """The text an image should show: ``metadata["text"]`` or the prompt's first quoted span."""
    if metadata.get("text"):
        return str(metadata["text"])
    match = _QUOTED.search(prompt)
    if match is None:
        raise ValueError(f"ocr reward: no target text in metadata['text'] nor in quotes in prompt {prompt!r}")
    return next(group for group in match.groups() if group is not None)


def _normalise(text: str) -> str:
    return "".join(text.lower().split())


class OCRReward:
    """Text-rendering accuracy in [0, 1] (see module docstring)."""

    modality = "image"

    def __init__(self) -> None:
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as error:
            raise ImportError("the ocr reward needs the 'ocr' extra: pip install 'flowrl[ocr]'") from error
        self.engine = RapidOCR()

    @classmethod
    def weights_status(cls) -> str:
        try:
            import rapidocr_onnxruntime
        except ImportError:
            return "missing: pip install 'flowrl[ocr]' (the models ship in the wheel)"
        return f"present: {rapidocr_onnxruntime.__file__.rsplit('/', 1)[0]}/models"

    def read(self, image: np.ndarray) -> str:
        """All text RapidOCR finds in an ``[H, W, 3]`` uint8 RGB image, joined."""
        result, _ = self.engine(image[:, :, ::-1].copy())  # RapidOCR takes OpenCV's BGR order
        return " ".join(line[1] for line in result or [])

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]]
    ) -> torch.Tensor:
        from rapidfuzz.distance import Levenshtein

        pixels = (images.detach().float().clamp(0, 1).cpu().permute(0, 2, 3, 1).numpy() * 255).round()
        scores = []
        for image, prompt, meta in zip(pixels.astype(np.uint8), prompts, metadata):
            target = _normalise(target_text(prompt, meta))
            distance = Levenshtein.distance(_normalise(self.read(image)), target)
            scores.append(1.0 - min(1.0, distance / max(len(target), 1)))
        return torch.tensor(scores, dtype=torch.float32)
