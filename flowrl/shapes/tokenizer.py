"""A word-level tokenizer over the shapes grammar's vocabulary.

Ids: 0 is padding, 1 is the begin token that starts every sequence (so the
empty prompt, used for classifier-free guidance, is the single begin token),
words follow from 2 in vocabulary order. An unknown word is an error.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_ID = 0
BEGIN_ID = 1


class ShapesTokenizer:
    """Maps prompts to fixed-length id tensors with an attention mask."""

    def __init__(self, vocabulary: Sequence[str], max_length: int) -> None:
        self.vocabulary = list(vocabulary)
        self.max_length = max_length
        self._ids = {word: index + 2 for index, word in enumerate(self.vocabulary)}

    @property
    def size(self) -> int:
        """Number of ids, padding and begin token included."""
        return len(self.vocabulary) + 2

    def token_id(self, word: str) -> int:
        """The id of a vocabulary word."""
        return self._ids[word]

    def words(self, prompt: str) -> list[str]:
        """The prompt's words: lower-cased, split on whitespace."""
        return prompt.lower().split()

    def unknown_words(self, prompt: str) -> list[str]:
        """Words of ``prompt`` outside the vocabulary."""
        return [word for word in self.words(prompt) if word not in self._ids]

    def encode(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B, max_length] long, mask [B, max_length] bool)``; mask is True on real tokens."""
        ids = torch.full((len(prompts), self.max_length), PAD_ID, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            unknown = self.unknown_words(prompt)
            if unknown:
                raise ValueError(
                    f"prompt {prompt!r} has words outside the shapes vocabulary: {unknown}; "
                    f"allowed words: {self.vocabulary}"
                )
            tokens = [BEGIN_ID] + [self._ids[word] for word in self.words(prompt)]
            if len(tokens) > self.max_length:
                raise ValueError(
                    f"prompt {prompt!r} has {len(tokens) - 1} words; at most {self.max_length - 1} are allowed"
                )
            ids[row, : len(tokens)] = torch.tensor(tokens)
        return ids, ids != PAD_ID
