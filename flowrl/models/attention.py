"""The attention kernel every layer of :class:`~flowrl.models.shapes_dit.ShapesDiT` calls, and the temporal
layer of its factorized video variant."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def cpu_autocast_enabled(x: torch.Tensor) -> bool:
    """Whether ``x`` is on the CPU inside a ``torch.autocast("cpu")`` region."""
    return x.device.type == "cpu" and torch.is_autocast_enabled("cpu")


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d)) v`` (``F.scaled_dot_product_attention``). Under CPU autocast it runs in
    float32: torch's CPU flash-attention backward in bfloat16 took 436 ms against 46 ms in float32 for
    one forward and backward of 32 shapes images (torch 2.14.1, one thread), which ate the bfloat16
    matrix products' gain; the projections around it stay in bfloat16."""
    if not cpu_autocast_enabled(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    with torch.autocast("cpu", enabled=False):
        attended = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=attn_mask)
    return attended.to(q.dtype)


class TemporalAttention(nn.Module):
    """Attention across the frames of each patch position, ``x + W_o attn(LN(x))`` with ``W_o = 0`` at init.

    Tokens ``[B, T N, D]`` (frame-major) attend over their ``T`` frames at the
    same position; the zero output projection makes a fresh layer the identity.
    """

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(hidden, eps=1e-6)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        batch, length, width = x.shape
        positions = length // frames
        # [B, T N, D] -> [B N, heads, T, D / heads]
        q, k, v = (
            part.view(batch, frames, positions, self.heads, width // self.heads)
            .permute(0, 2, 3, 1, 4)
            .reshape(batch * positions, self.heads, frames, width // self.heads)
            for part in self.qkv(self.norm(x)).chunk(3, -1)
        )
        attended = attention(q, k, v)
        attended = attended.view(batch, positions, self.heads, frames, width // self.heads)
        return x + self.out(attended.permute(0, 3, 1, 2, 4).reshape(batch, length, width))
